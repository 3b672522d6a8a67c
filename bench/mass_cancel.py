"""Benchmark: ``scancel -u USER`` of thousands of pending jobs, the command as a user runs it.

Usage: ``python bench/mass_cancel.py [--jobs 8000 20000] [--arrays 50] [--rounds 2] [--before DIR]``. Starts
a local cluster (2 nodes; with ``--before``, a second one whose services and commands run the checkout in
DIR, measured in turn) and, for each count, submits that many held jobs from a concurrent API client (with
``--arrays N``: N arrays of 1,001 held tasks instead), waits until squeue shows them all, then times
``scancel -u USER`` (the command's wall time and exit status) and the wait until squeue shows none. Results
are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgspec
from api_load import Load, run_load, trivial_spec  # bench/ is this script's directory: on sys.path
from bench_clusters import BenchCluster, add_before, clusters, trees_of

from corral.cli import cmdclient
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.libs.slurm.array import parse_array
from corral.schemas import api, subjects
from corral.schemas.codec import decode, encode

BIN = Path(sys.executable).parent


def command_env(bench: BenchCluster) -> dict[str, str]:
    """The environment of a command of this cluster's user, running the cluster's checkout (its own runtime
    directory: a command server started by one cluster's commands serves only them)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    runtime = bench.cluster.state_dir / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env.update(
        CORRAL_STATE_DIR=str(bench.cluster.state_dir),
        PYTHONPATH=str(bench.tree),
        XDG_RUNTIME_DIR=str(runtime),
    )
    return env


def live(bench: BenchCluster) -> list[str]:
    """The user's jobs squeue shows (``A_T`` for each array task)."""
    out = subprocess.run(
        [str(BIN / "squeue"), "-h", "-r", "-u", bench.cluster.user, "-o", "%i"],
        env=command_env(bench),
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def wait_live(bench: BenchCluster, done: bool, count: int, timeout: float = 600.0) -> float:
    """Seconds until squeue shows ``count`` jobs or more (``done``: none)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        shown = len(live(bench))
        if (shown == 0) if done else (shown >= count):
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"squeue still shows {shown} jobs after {timeout:.0f} s")


def submit_arrays(bench: BenchCluster, arrays: int) -> None:
    """``arrays`` arrays of 1,001 held tasks, one submission each."""

    async def submit() -> None:
        creds = read_credentials(bench.cluster.user_credentials)
        nc = await connect(creds, name="bench-arrays")
        spec = msgspec.structs.replace(trivial_spec(True), array=parse_array("0-1000"))
        for _ in range(arrays):
            request = api.SubmitRequest(token=uuid.uuid4().hex, spec=spec)
            reply = await nc.request(subjects.api_subject("submit", creds.user), encode(request), timeout=30)
            assert isinstance(decode(reply.data, api.SubmitReply | api.ApiError), api.SubmitReply), reply.data
        await nc.drain()

    asyncio.run(submit())


def measure(bench: BenchCluster, jobs: int, arrays: bool = False) -> str:
    """One row: submit ``jobs`` held jobs (``arrays``: ``jobs`` / 1,001 arrays), cancel them with
    ``scancel -u``."""
    if arrays:
        submit_arrays(bench, jobs // 1001)
    else:
        result = run_load(bench.cluster.user_credentials, Load(jobs=jobs, in_flight=8, batch=100, held=True))
        assert not result.errors, result.errors[:3]
    wait_live(bench, False, jobs)
    cpu = bench.cpu()
    started = time.monotonic()
    out = subprocess.run(
        [str(BIN / "scancel"), "-u", bench.cluster.user],
        env=command_env(bench),
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.monotonic() - started
    error = out.stderr.strip().splitlines()[-1][:90] if out.returncode else ""
    gateway = bench.cpu().get("gateway", 0.0) - cpu.get("gateway", 0.0)
    if out.returncode:
        # Nothing was cancelled: cancel them by id in smaller requests, for the next row to start empty.
        ids = live(bench)
        for start in range(0, len(ids), 2000):
            subprocess.run(
                [str(BIN / "scancel"), *ids[start : start + 2000]], env=command_env(bench), check=True
            )
    empty = wait_live(bench, True, 0)
    shape = f"{jobs // 1001} arrays x 1,001" if arrays else f"{jobs:,}"
    return (
        f"| {bench.name} | {shape} | {out.returncode} | {took:.2f} | {gateway:.2f} | {took + empty:.1f} |"
        f" {error} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, nargs="+", default=[8000, 20000])
    parser.add_argument("--arrays", type=int, default=0, help="then this many arrays of 1,001 tasks")
    parser.add_argument(
        "--rounds", type=int, default=1, help="measure each count this many times, alternating"
    )
    add_before(parser)
    args = parser.parse_args()
    trees = trees_of(args)
    lines = [
        "| code | jobs | scancel exit | scancel wall s | gateway CPU s | until squeue shows none (s) "
        "| error |",
        "|---|---|---|---|---|---|---|",
    ]
    with clusters(trees) as benches:
        for r in range(args.rounds):
            for jobs in (n for n in args.jobs if n):
                for bench in benches if r % 2 == 0 else list(reversed(benches)):
                    lines.append(measure(bench, jobs))
                    print(lines[-1], flush=True)
            for bench in benches if r % 2 == 0 else list(reversed(benches)):
                if args.arrays:
                    lines.append(measure(bench, args.arrays * 1001, arrays=True))
                    print(lines[-1], flush=True)
        for bench in benches:
            cmdclient.stop_servers(cmdclient.runtime_dir(command_env(bench)))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
