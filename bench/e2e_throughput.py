"""Benchmark: trivial jobs (``true``) completed per second, end to end, on a local cluster.

Usage: ``python bench/e2e_throughput.py [--jobs 2000] [--sbatch 300] [--before DIR] [--nodes 2] [--rounds 1]``
(``--rounds``: below). Starts a local cluster (``--nodes`` x 4 GPUs; with ``--before``, a second one running
the checkout in DIR, measured in turn with this one) and, on each:

1. **API client**: submits ``--jobs`` one-CPU jobs that run ``true``, from the concurrent API client of
   ``api_load.py`` (one process: ``submit`` requests, 64 in flight; with ``--batch N``, ``submit_batch``
   requests of N jobs, 4 in flight), and waits until the queue is empty;
2. **sbatch loop**: submits ``--sbatch`` such jobs from a shell loop (``for i in ...; do sbatch --wrap=true;
   done``, each ``sbatch`` a process served by the user's command server, as a user's script does), and
   waits until the queue is empty.

From the log (each entry's ``occurred_at``, this machine's clock): submissions/s (first to last
``JobSubmitted``), launches/s (``RunStarted``), completions/s (first to last ``JobCompleted``), and the time
from the first submission until the queue is empty (the last ``JobCompleted``); then how long accounting took
to show every job COMPLETED in ``sacct`` after that. Also the CPU each process used per job.

The wait for an empty queue asks ``squeue`` (the ``jobs`` verb) once a second: its reply lists every live job
of the user, thousands at first, and asked four times a second it took ~16% of the scheduler's time. With
``--rounds N`` the phases run N times, the clusters' order reversed every other round (a shared VM's speed
drifts by tens of percent within minutes), and the medians of each code's rounds close the output.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from api_load import Load, run_load  # bench/ is this script's directory: on sys.path
from bench_clusters import BenchCluster, clusters

from corral.cli import cmdclient
from corral.cli.client import Cluster
from corral.libs.infra import roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import api
from corral.schemas import events as ev

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


@dataclass
class Phase:
    """What the log says about one phase's jobs."""

    name: str  # "API client" or "sbatch loop"
    jobs: int  # jobs submitted
    submitted: list[float] = field(default_factory=list)  # occurred_at of each JobSubmitted
    started: list[float] = field(default_factory=list)  # of each job's first RunStarted
    completed: list[float] = field(default_factory=list)  # of each JobCompleted
    other_ends: int = 0  # jobs that ended otherwise (failed, cancelled ...)
    accounted_s: float = float("nan")  # seconds after the last completion until sacct showed all
    plans: tuple[float, float] = (0.0, 0.0)  # the scheduler's cycles that planned, and their seconds in all

    @staticmethod
    def rate(times: list[float]) -> float:
        """Events per second from the first to the last."""
        return (len(times) - 1) / (max(times) - min(times)) if len(times) > 1 else float("nan")

    def row(self, code: str, cpu: dict[str, float]) -> str:
        """The Markdown table row."""
        empty = max(self.completed) - min(self.submitted) if self.completed else float("nan")
        total = sum(cpu.values()) / max(self.jobs, 1) * 1000
        return (
            f"| {self.name} | {code} | {self.jobs} | {self.rate(self.submitted):,.0f} | "
            f"{self.rate(self.started):,.0f} | {self.rate(self.completed):,.0f} | {empty:.1f} | "
            f"{self.accounted_s:.1f} | {self.other_ends} | {total:.1f} |"
        )


async def read_phase(bench: BenchCluster, phase: Phase, ids: set[int]) -> None:
    """Fill ``phase`` from the log's entries about ``ids``."""
    creds = read_credentials(bench.cluster.role_credentials(roles.ADMIN))
    nc = await connect(creds, name="bench-read")
    seen_start: set[int] = set()
    try:
        async for entry in Bus(nc, "bench").read(1):
            env = entry.envelope
            if env is None or getattr(env.body, "job_id", None) not in ids:
                continue
            body, at = env.body, env.meta.occurred_at
            if isinstance(body, ev.JobSubmitted):
                phase.submitted.append(at)
            elif isinstance(body, ev.RunStarted) and body.job_id not in seen_start:
                seen_start.add(body.job_id)
                phase.started.append(at)
            elif isinstance(body, ev.JobCompleted):
                phase.completed.append(at)
            elif isinstance(body, ev.JobFailed | ev.JobCancelled | ev.JobPreempted):
                phase.other_ends += 1
    finally:
        await nc.drain()


def wait_empty(cluster: Cluster, ids: set[int], timeout: float) -> None:
    """Wait until none of ``ids`` is pending or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = cluster.jobs(api.JobsRequest(users=[cluster.user]))
        if not any(j.job_id in ids for j in live):
            return
        time.sleep(1.0)
    raise TimeoutError(f"jobs still live after {timeout:.0f} s")


def wait_accounted(cluster: Cluster, ids: set[int], timeout: float) -> float:
    """Seconds until sacct shows every one of ``ids`` COMPLETED."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        acct = cluster.acct(api.AcctRequest(users=[cluster.user], states=["COMPLETED"], limit=100_000))
        if ids <= {j.job_id for j in acct}:
            return time.monotonic() - started
        time.sleep(0.25)
    return float("nan")


def sbatch_loop(bench: BenchCluster, jobs: int, work: Path) -> set[int]:
    """Submit ``jobs`` jobs from a shell loop of sbatch commands; their ids."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    env.update(
        CORRAL_STATE_DIR=str(bench.cluster.state_dir),
        XDG_RUNTIME_DIR=str(work / "runtime"),
        PYTHONPYCACHEPREFIX=str(work / "pycache"),  # as an installed Corral, compiled once
        PYTHONPATH=str(bench.tree),
    )
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    (work / "runtime").mkdir(mode=0o700, exist_ok=True)
    script = f'for i in $(seq {jobs}); do "{BIN}/sbatch" --parsable -o /dev/null --wrap=true; done'
    subprocess.run([str(BIN / "sbatch"), "--parsable", "-H", "--wrap=true"], env=env, cwd=work, check=True)
    out = subprocess.run(
        ["bash", "-c", script], env=env, cwd=work, capture_output=True, text=True, check=True
    )
    cmdclient.stop_servers(cmdclient.runtime_dir(env))
    return {int(line) for line in out.stdout.split()}


def measure(
    bench: BenchCluster, name: str, jobs: int, batch: int, timeout: float
) -> tuple[Phase, dict[str, float]]:
    """One phase on one cluster: submit, wait for the queue to empty and for accounting."""
    creds = read_credentials(bench.cluster.user_credentials)
    cluster = Cluster(url=creds.url, credentials=creds)
    work = bench.cluster.state_dir / "work"
    work.mkdir(exist_ok=True)
    before, planned = bench.cpu(), plans_of(bench)
    if name == "API client":
        result = run_load(
            bench.cluster.user_credentials,
            Load(jobs=jobs, in_flight=4 if batch else 64, batch=batch, held=False, workdir=str(work)),
        )
        ids = set(result.ids)
    else:
        ids = sbatch_loop(bench, jobs, work)
    wait_empty(cluster, ids, timeout)
    after = bench.cpu()
    phase = Phase(name, len(ids))
    phase.plans = tuple(b - a for a, b in zip(planned, plans_of(bench), strict=True))  # type: ignore[assignment]
    phase.accounted_s = wait_accounted(cluster, ids, timeout)
    asyncio.run(read_phase(bench, phase, ids))
    return phase, {k: after[k] - before.get(k, 0.0) for k in after}


def plans_of(bench: BenchCluster) -> tuple[float, float]:
    """The scheduler's cycles that planned so far, and their seconds in all (its cycle-duration histogram)."""
    url = bench.cluster.metrics_urls.get("scheduler")
    if url is None:
        return (0.0, 0.0)
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    found = dict.fromkeys(("_count", "_sum"), 0.0)
    for line in text.splitlines():
        for suffix in found:
            if line.startswith(f"corral_scheduler_cycle_duration_seconds{suffix} "):
                found[suffix] = float(line.split()[1])
    return found["_count"], found["_sum"]


def main() -> int:
    """Run both phases on each cluster and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000, help="jobs from the API client")
    parser.add_argument("--sbatch", type=int, default=300, help="jobs from the sbatch loop (0: none)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--batch", type=int, default=0, help="jobs per submit_batch request (0: submit)")
    parser.add_argument("--before", type=Path, help="a checkout whose services run on a second cluster")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--rounds", type=int, default=1, help="run the phases this many times, alternating")
    args = parser.parse_args()
    trees = {"after": HERE.parent}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    lines = [
        "| phase | code | jobs | submissions/s | launches/s | completions/s | first submit -> queue empty "
        "(s) | then until sacct shows all (s) | other ends | CPU ms / job, all processes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    phases = [("API client", args.jobs)] + ([("sbatch loop", args.sbatch)] if args.sbatch else [])
    runs: dict[tuple[str, str], list[tuple[Phase, dict[str, float]]]] = {}
    with clusters(trees, nodes=args.nodes, metrics=True) as benches:
        for r in range(args.rounds):
            for k, (name, jobs) in enumerate(phases):
                for bench in benches if (k + r) % 2 == 0 else list(reversed(benches)):
                    phase, cpu = measure(bench, name, jobs, args.batch, args.timeout)
                    runs.setdefault((name, bench.name), []).append((phase, cpu))
                    lines.append(phase.row(bench.name, cpu))
                    print(lines[-1], flush=True)
                    print("  " + cpu_line(cpu, phase.jobs), flush=True)
                    count, seconds = phase.plans
                    print(f"  scheduler: {count:.0f} cycles that planned, {seconds:.2f} s in all", flush=True)
    print("\n".join(lines))
    if args.rounds > 1:
        print("\nMedians of the rounds:")
        for (name, code), done in runs.items():
            cpu = {p: statistics.median(c.get(p, 0.0) for _, c in done) for p in done[0][1]}
            rates = [p.rate(p.completed) for p, _ in done]
            print(
                f"  {name}, {code}: completions/s {statistics.median(rates):.0f}"
                f" (each: {', '.join(f'{r:.0f}' for r in rates)}); " + cpu_line(cpu, done[0][0].jobs)
            )
    return 0


def cpu_line(cpu: dict[str, float], jobs: int) -> str:
    """The CPU each process used per job, the largest first, and in all."""
    per_job = 1000 / max(jobs, 1)
    used = sorted(cpu.items(), key=lambda kv: -kv[1])
    return f"CPU ms / job: all {sum(cpu.values()) * per_job:.1f}: " + ", ".join(
        f"{p} {v * per_job:.2f}" for p, v in used if v > 0
    )


if __name__ == "__main__":
    raise SystemExit(main())
