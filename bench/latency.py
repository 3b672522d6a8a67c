"""Benchmark: submit-to-start latency on an idle local cluster, and command wall time.

Usage: ``python bench/latency.py [--jobs 200] [--runs 30]``. Starts its own local cluster (2 nodes x 4 GPUs)
in a temporary state directory, then:

1. submits ``--jobs`` one-GPU jobs one at a time, each only after the previous one ended (so the cluster
   is idle), and measures submit -> start as ``RunStarted.occurred_at - JobSubmitted.occurred_at`` read from
   the log (both clocks are this machine's);
2. times ``sbatch``, ``squeue``, ``sacct -j`` and ``scontrol show job`` as a user runs them
   (fresh process each time), served by the user's command server (``corral.cli.cmdserver``, the default)
   and, alternately, in a process of their own (``CORRAL_CMD_SERVER=off``), and ``srun -N2 -n4 true``
   inside a 2-node job and ``srun true`` outside one (allocation included);
3. in the same loop, the interpreter's own start (``python -c pass``, and ``-S`` without ``site``): the floor
   under any command written in Python.

``--before DIR`` compares with another version in the same run: DIR is a copy of that version's tree (for
example ``git archive COMMIT | tar -x -C DIR``), whose served commands are timed alternately with this
checkout's, started from ``--before-bin`` (default: this environment's ``bin``) with ``PYTHONPATH=DIR``; each
version has its own command server. Both versions' commands call this checkout's cluster, unless
``--before-cluster``: then the before version's go to a second local cluster, of DIR's own services (started
by ``--before-bin``'s interpreter), so that a change in a service (the gateway's) is compared too.

Bytecode: an installed Corral (a wheel) has its modules compiled at install time, but this checkout is an
editable install and the machine sets ``PYTHONDONTWRITEBYTECODE=1``, so every command would recompile
every Corral module it imports (~20 ms). By default the commands run with a bytecode cache of their own
(``PYTHONPYCACHEPREFIX`` in the state directory, filled by the first calls), as installed; with
``--source-only`` they run as this environment has them.

Prints a Markdown table; results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.cli import cmdclient
from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.infra import roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import events as ev

BIN = Path(sys.executable).parent
SCRIPT = "#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n"


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def run(
    argv: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None, bin_dir: Path = BIN
) -> tuple[float, str]:
    """Run a command of ``bin_dir``; (wall seconds, stdout)."""
    started = time.perf_counter()
    out = subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
    return time.perf_counter() - started, out.stdout


async def latencies(cluster: LocalCluster, job_ids: list[int]) -> list[float]:
    """Submit -> RunStarted for each job, from the log."""
    creds = read_credentials(cluster.role_credentials(roles.ADMIN))
    nc = await connect(creds, name="bench")
    bus = Bus(nc, actor="bench")
    submitted: dict[int, float] = {}
    started: dict[int, float] = {}
    async for entry in bus.read(1):
        if entry.envelope is None:
            continue
        body = entry.envelope.body
        if isinstance(body, ev.JobSubmitted):
            submitted[body.job_id] = entry.envelope.meta.occurred_at
        elif isinstance(body, ev.RunStarted):
            started.setdefault(body.job_id, entry.envelope.meta.occurred_at)
    await nc.drain()
    return [started[j] - submitted[j] for j in job_ids if j in started]


def srun_in_job(env: dict[str, str], work: Path, runs: int) -> list[float]:
    """Wall times of ``srun -N2 -n4 true`` measured inside a 2-node job (the job times its own steps)."""
    bin_dir = Path(sys.executable).parent
    script = (
        f"#!/bin/bash\nexport PATH={bin_dir}:$PATH\nfor i in $(seq {runs}); do\n"
        "  s=$(date +%s%N); srun -N2 -n4 true; e=$(date +%s%N); echo step $(( (e - s) / 1000 ))\ndone\n"
    )
    _, out = run(["sbatch", "--parsable", "-N2", "-n4", "-o", "srun-bench-%j.out"], env, work, stdin=script)
    job = out.strip()
    while True:
        _, row = run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "State"], env, work)
        if row.strip() in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        time.sleep(0.2)
    text = (work / f"srun-bench-{job}.out").read_text()
    return [int(line.split()[1]) / 1e6 for line in text.splitlines() if line.startswith("step ")]


def _until_served(env: dict[str, str], work: Path, bin_dir: Path) -> None:
    """Wait for the command server of ``env``'s version to serve (the first command started it)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            run(["squeue"], {**env, "CORRAL_CMD_SERVER": "require"}, work, bin_dir=bin_dir)
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: Started by the interpreter of ``--before-bin`` with ``PYTHONPATH`` the before tree: its local cluster, up
#: until its stdin closes.
_OTHER_CLUSTER = """
import getpass, sys
from pathlib import Path
from corral.cli.local_cluster import LocalCluster, ensure_resolvable
cluster = LocalCluster(Path(sys.argv[1]), getpass.getuser(), nodes=2, gpus_per_node=4)
ensure_resolvable([n.name for n in cluster.prepare().nodes])
cluster.start()
print("up", flush=True)
try:
    sys.stdin.read()
finally:
    cluster.stop()
"""


def other_cluster(tree: Path, bin_dir: Path, state: Path) -> subprocess.Popen[str]:
    """A local cluster of ``tree``'s own code in ``state``, once it is up; stopped by closing its stdin."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    proc = subprocess.Popen(
        [str(bin_dir / "python"), "-c", _OTHER_CLUSTER, str(state)],
        env={**env, "PYTHONPATH": str(tree.resolve())},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # its start-up logs, then "up"
        if line.strip() == "up":
            return proc
    proc.communicate()  # it ended: whatever it started is stopped
    raise RuntimeError(f"the cluster of {tree} did not start")


def finished_job(env: dict[str, str], work: Path, bin_dir: Path = BIN) -> str:
    """Submit a one-GPU job and wait for its end; its id."""
    _, out = run(["sbatch", "--parsable"], env, work, stdin=SCRIPT, bin_dir=bin_dir)
    job = out.strip()
    while True:
        _, row = run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "State"], env, work, bin_dir=bin_dir)
        if row.strip() in ("COMPLETED", "FAILED"):
            return job
        time.sleep(0.02)


def main() -> int:
    """Run the benchmark and print the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--source-only", action="store_true", help="no bytecode cache for the commands (see the docstring)"
    )
    parser.add_argument("--before", type=Path, help="a tree of another version to compare with (docstring)")
    parser.add_argument("--before-bin", type=Path, default=BIN, help="where that version's commands are")
    parser.add_argument("--no-srun", action="store_true", help="leave out the srun timings")
    parser.add_argument("--before-cluster", action="store_true", help="the before version's own cluster")
    args = parser.parse_args()
    state = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    cluster = LocalCluster(state, getpass.getuser(), nodes=2, gpus_per_node=4)
    config = cluster.prepare()
    ensure_resolvable([n.name for n in config.nodes])
    work = state / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["CORRAL_STATE_DIR"] = str(state)
    if not args.source_only:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(state / "pycache")
    # the command server of these commands (cmdserver) lives in the bench's own directory and stops with it
    (state / "runtime").mkdir(mode=0o700)
    env["XDG_RUNTIME_DIR"] = str(state / "runtime")
    direct = {**env, "CORRAL_CMD_SERVER": "off"}
    other: subprocess.Popen[str] | None = None
    try:
        cluster.start()
        ids = [int(finished_job(env, work)) for _ in range(args.jobs)]
        lat = asyncio.run(latencies(cluster, ids))
        for warm in (["squeue"], ["scontrol", "show", "job", str(ids[-1])], ["srun", "--version"]):
            run(warm, direct, work)  # the bytecode of every command's modules, before timing
        # each version's server is up (the first command starts it; "require" fails if it is not serving)
        versions = {"": (env, BIN)}
        job = {"": str(ids[-1])}  # each version's job to show
        if args.before is not None:
            before_env = {**env, "PYTHONPATH": str(args.before.resolve())}
            job[" (before)"] = str(ids[-1])
            if args.before_cluster:
                other = other_cluster(args.before, args.before_bin, state / "before")
                before_env["CORRAL_STATE_DIR"] = str(state / "before")
                job[" (before)"] = finished_job(before_env, work, args.before_bin)
            versions[" (before)"] = (before_env, args.before_bin)
        for version_env, bin_dir in versions.values():
            run(["squeue"], version_env, work, bin_dir=bin_dir)
            _until_served(version_env, work, bin_dir)
        commands = {
            "sbatch": (["sbatch", "--parsable", "--gres=gpu:1"], SCRIPT),
            "squeue": (["squeue"], None),
            "sacct -j": (["sacct", "-j", "{job}"], None),
            "scontrol show job": (["scontrol", "show", "job", "{job}"], None),
        }
        timings: dict[str, list[float]] = {}
        for name in commands:
            for suffix in versions:
                timings[name + suffix] = []
            timings[f"{name} (in its own process)"] = []
        floors = {"python -c pass": ["-c", "pass"], "python -S -c pass": ["-S", "-c", "pass"]}
        for name in floors:
            timings[name] = []
        load = [os.getloadavg()[0]]
        for _ in range(args.runs):
            for name, (argv, stdin) in commands.items():  # served (each version) and not, alternately
                for suffix, (version_env, bin_dir) in versions.items():
                    mine = [word.format(job=job[suffix]) for word in argv]
                    timings[name + suffix].append(run(mine, version_env, work, stdin, bin_dir)[0])
                mine = [word.format(job=job[""]) for word in argv]
                timings[f"{name} (in its own process)"].append(run(mine, direct, work, stdin=stdin)[0])
            for name, flags in floors.items():
                timings[name].append(run(["python3", *flags], env, work)[0])
        load.append(os.getloadavg()[0])
        if not args.no_srun:
            timings["srun -N2 -n4 true (in a job)"] = srun_in_job(env, work, args.runs)
            allocating = [run(["srun", "true"], env, work)[0] for _ in range(args.runs // 3)]
            timings["srun true (allocates)"] = allocating
        print(f"load average (1 min) when the command timings began and ended: {load[0]:.2f}, {load[1]:.2f}")
        print("| metric | n | p50 | p95 | p99 |\n|---|---|---|---|---|")
        ms = [x * 1000 for x in lat]
        print(
            f"| submit -> start (ms) | {len(ms)} | {statistics.median(ms):.1f} | {pct(ms, 95):.1f} | "
            f"{pct(ms, 99):.1f} |"
        )
        for name, values in timings.items():
            vs = [x * 1000 for x in values]
            print(
                f"| `{name}` wall (ms) | {len(vs)} | {statistics.median(vs):.1f} | {pct(vs, 95):.1f} | "
                f"{pct(vs, 99):.1f} |"
            )
        return 0
    finally:
        cmdclient.stop_servers(cmdclient.runtime_dir(env))
        if other is not None:
            other.communicate()  # its stdin closed: it stops its cluster
        cluster.stop()
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
