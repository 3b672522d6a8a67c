"""Local clusters for the throughput benchmarks, each running the code of a given checkout.

A before/after comparison runs two clusters at once on this machine, one whose services import Corral from
another checkout (``--before DIR``: e.g. ``git archive main | tar -x -C DIR``) and one from this one, and
alternates the measurements between them, so both see the same machine load. The services are started
with ``PYTHONPATH`` set to their checkout (``LocalCluster`` passes its environment on to them).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.infra import roles


@contextlib.contextmanager
def code_of(tree: Path) -> Iterator[None]:
    """``PYTHONPATH`` naming ``tree``, and ``tree`` the working directory, while processes are started in this
    block: ``python -m`` puts its working directory first on ``sys.path``, before ``PYTHONPATH``, so a
    service started from another checkout would import that one's code."""
    before, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    os.environ["PYTHONPATH"] = str(tree)
    os.chdir(tree)
    try:
        yield
    finally:
        os.chdir(cwd)
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


@dataclass
class BenchCluster:
    """One local cluster and the checkout its services run."""

    name: str  # "before" or "after"
    tree: Path  # the checkout (holds the ``corral`` package)
    cluster: LocalCluster  # the cluster
    gateways: int = 1  # gateway processes running

    def add_gateways(self, total: int) -> None:
        """Start gateways until ``total`` run (more replicas of the queue group), and wait for each."""
        while self.gateways < total:
            self.gateways += 1
            name = f"gateway-{self.gateways}"
            with code_of(self.tree):
                self.cluster._spawn(  # the bench adds replicas as --ha does
                    name,
                    roles.GATEWAY,
                    "corral.services.gateway",
                    ["--admin", roles.ADMIN, "--auditor", roles.AUDITOR],
                )
            wait_started(self.cluster.state_dir / "logs" / f"{name}.log")

    def cpu(self) -> dict[str, float]:
        """CPU seconds each process of the cluster has used so far (NATS included), and what its descendants
        used (``<name> children``: the children it has waited for, and the live ones with theirs: an agent's
        supervisor fork server, which reaps the job supervisors it forked, and those supervisors and jobs)."""
        tick = os.sysconf("SC_CLK_TCK")
        pids = {p.name: p.proc.pid for p in self.cluster.processes if p.proc is not None}
        if self.cluster.nats is not None and self.cluster.nats.pid is not None:
            pids["nats-server"] = self.cluster.nats.pid
        stats = process_stats()
        kids: dict[int, list[int]] = {}
        for pid, fields in stats.items():
            kids.setdefault(int(fields[1]), []).append(pid)
        used = {}
        for name, pid in pids.items():
            if pid not in stats:
                continue
            fields = stats[pid]
            used[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            children = (int(fields[13]) + int(fields[14])) / tick  # cutime, cstime
            todo = list(kids.get(pid, []))
            while todo:  # live descendants: their own time and their waited-for children's
                child = todo.pop()
                children += sum(int(f) for f in stats[child][11:15]) / tick
                todo.extend(kids.get(child, []))
            if children:
                used[f"{name} children"] = children
        return used


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a live process has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_stats() -> dict[int, list[str]]:
    """Every live process's ``/proc/<pid>/stat`` fields after the command (state first)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stats[int(entry)] = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
    return stats


def wait_started(log: Path, timeout: float = 30.0) -> None:
    """Wait until a service's log says it started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and '"started"' in log.read_text():
            time.sleep(0.5)  # its subscriptions follow the line by a moment
            return
        time.sleep(0.1)
    raise TimeoutError(f"{log} never said started")


@contextlib.contextmanager
def clusters(
    trees: dict[str, Path], nodes: int = 2, gpus_per_node: int = 4, metrics: bool = False
) -> Iterator[list[BenchCluster]]:
    """One started cluster per named checkout, in temporary state directories; stopped and removed on exit."""
    root = Path(tempfile.mkdtemp(prefix="corral-thru-"))
    started: list[BenchCluster] = []
    try:
        for name, tree in trees.items():
            cluster = LocalCluster(
                root / name, getpass.getuser(), nodes=nodes, gpus_per_node=gpus_per_node, metrics=metrics
            )
            config = cluster.prepare()
            ensure_resolvable([n.name for n in config.nodes])
            bench = BenchCluster(name, tree, cluster)
            started.append(bench)
            with code_of(tree):
                cluster.start()
        yield started
    finally:
        for bench in started:
            with contextlib.suppress(Exception):
                bench.cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def add_before(parser: argparse.ArgumentParser) -> None:
    """The ``--before DIR`` option of a benchmark that compares two checkouts on two clusters."""
    parser.add_argument(
        "--before", type=Path, help="a checkout whose services and commands run on a second cluster"
    )


def trees_of(args: argparse.Namespace) -> dict[str, Path]:
    """The checkouts to measure: ``--before``'s first if given, then this one."""
    trees = {"after": Path(__file__).resolve().parents[1]}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    return trees
