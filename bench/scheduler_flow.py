"""Benchmark: what the scheduler alone keeps up with, jobs through it per second, without agents or jobs.

Usage: ``python bench/scheduler_flow.py [--jobs 5000] [--nodes 16] [--cpus 32] [--before DIR] [--rounds 1]``.

End to end (``e2e_throughput.py``) every service shares the machine's cores with the jobs, so a change to one
service moves the total by less than the run-to-run noise of a shared VM. This bench runs the scheduler
service (``Scheduler.rebuild``, ``follow`` and ``ticker``, as ``corral up`` runs them, with its metrics) in a
process of its own on a real nats-server, and plays the rest in this process: it appends ``--jobs`` one-CPU
submissions at once (a burst, pipelined), and a fake agent that follows the work stream answers each launch
order at once with the run's start and its exit (exit code 0). ``--nodes`` x ``--cpus`` slots, so that the
slots are not the bound. It reports the time from the first submission to the last ``JobCompleted``, jobs
completed per second, and the scheduler process's CPU per job (user + system, from ``/proc``). With
``--before DIR`` a second scheduler, the checkout in DIR, runs the same flow on a fresh log, in turn with
this one (``--rounds``: alternating, medians at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import decode

HERE = Path(__file__).resolve().parent
PASSWORDS = {roles.SCHEDULER: "bench-scheduler-secret", roles.ADMIN: "bench-admin-secret"}

CONFIG = """
[[nodes]]
names = "f[1-{nodes}]"
cpus = {cpus}
memory = "256G"
gpus = 0

[[partitions]]
name = "flow"
nodes = "f[1-{nodes}]"
default = true
"""

SPEC = ev.JobSpec(name="flow", script="#!/bin/sh\ntrue\n", workdir="/tmp", time_limit_s=600, partition="flow")


def child(url: str, config_path: str) -> None:
    """The scheduler process: rebuild, then follow and decide until SIGTERM."""
    import signal

    from prometheus_client import CollectorRegistry

    from corral.libs.config.cluster import parse_config
    from corral.services.scheduler.app import Scheduler
    from corral.services.scheduler.metrics import SchedulerMetrics

    async def run() -> None:
        creds = Credentials(url=url, user=roles.SCHEDULER, password=PASSWORDS[roles.SCHEDULER])
        nc = await connect(creds, name="bench-scheduler")
        config = parse_config(Path(config_path).read_text())
        scheduler = Scheduler(
            Bus(nc, actor=roles.SCHEDULER), config, metrics=SchedulerMetrics(CollectorRegistry())
        )
        await scheduler.rebuild()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        tasks = [asyncio.create_task(scheduler.follow(stop)), asyncio.create_task(scheduler.ticker(stop))]
        await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await nc.close()

    asyncio.run(run())


async def flow(
    server: NatsServer, tree: Path, jobs: int, nodes: int, cpus: int, work: Path
) -> dict[str, float]:
    """One flow on a fresh log: the scheduler of ``tree`` in its own process; the measures."""
    from bench_clusters import cpu_seconds  # (here: the scheduler's child process does not load it)

    admin_nc = await connect(
        Credentials(url=server.url, user=roles.ADMIN, password=PASSWORDS[roles.ADMIN]), name="bench-flow"
    )
    admin = Bus(admin_nc, actor=roles.ADMIN)
    for stream in (subjects.EVENTS_STREAM, subjects.WORK_STREAM, subjects.DLQ_STREAM):
        with contextlib.suppress(Exception):
            await admin.js.delete_stream(stream)
    with contextlib.suppress(Exception):
        await admin.js.delete_stream(f"OBJ_{subjects.SNAPSHOT_BUCKET}")
    await declare(admin.js)
    config = work / "cluster.toml"
    config.write_text(CONFIG.format(nodes=nodes, cpus=cpus))
    for i in range(1, nodes + 1):
        await admin.append(
            ev.NodeRegistered(node=f"f{i}", cpus=cpus, mem_mb=256 * 1024, gpus=0, partitions=["flow"])
        )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "scheduler_flow.py"), "--child", server.url, str(config)],
        env=env,
        cwd=tree,
    )
    done: set[int] = set()
    finished = asyncio.Event()
    reports: set[asyncio.Task[None]] = set()

    async def report(order: api.LaunchOrder) -> None:
        await admin.append(ev.RunStarted(job_id=order.job_id, attempt=order.attempt, node=order.node, pid=1))
        await admin.append(
            ev.RunExited(job_id=order.job_id, attempt=order.attempt, node=order.node, exit_code=0)
        )

    async def on_order(msg: object) -> None:
        order = decode(msg.data, api.Order)  # type: ignore[attr-defined]
        if isinstance(order, api.LaunchOrder):
            task = asyncio.create_task(report(order))
            reports.add(task)
            task.add_done_callback(reports.discard)

    async def on_completed(msg: object) -> None:
        done.add(int(msg.subject.split(".")[3]))  # type: ignore[attr-defined]
        if len(done) >= jobs:
            finished.set()

    try:
        await asyncio.sleep(1.0)  # (the scheduler rebuilds the short log and follows)
        await admin_nc.subscribe(subjects.job_subject("*", "job_completed"), cb=on_completed)
        await admin.js.subscribe(
            subjects.WORK_SUBJECTS, stream=subjects.WORK_STREAM, ordered_consumer=True, cb=on_order
        )
        first = await admin.next_job_id(jobs)
        cpu_before, started = cpu_seconds(proc.pid), time.perf_counter()
        for at in range(0, jobs, 500):
            batch = range(first + at, first + min(at + 500, jobs))
            await asyncio.gather(
                *(admin.append(ev.JobSubmitted(job_id=j, user="alice", spec=SPEC)) for j in batch)
            )
        submitted = time.perf_counter() - started
        await asyncio.wait_for(finished.wait(), timeout=max(600.0, jobs / 5))
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(proc.pid) - cpu_before
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        proc.kill()
        await admin_nc.close()
    return {
        "submitted_s": submitted,
        "elapsed_s": elapsed,
        "rate": jobs / elapsed,
        "cpu_ms": cpu * 1000 / jobs,
    }


def main() -> int:
    """Run the flows and print one line each, and the medians with ``--rounds``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--cpus", type=int, default=32)
    parser.add_argument("--before", type=Path, help="a checkout whose scheduler runs the same flow, in turn")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    trees = {"after": HERE.parent}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="corral-flow-") as tmp:
        users = [roles.service_user(role, password) for role, password in PASSWORDS.items()]
        with NatsServer(Path(tmp) / "nats", users) as server:
            for r in range(args.rounds):
                for code in trees if r % 2 == 0 else list(reversed(trees)):
                    got = asyncio.run(flow(server, trees[code], args.jobs, args.nodes, args.cpus, Path(tmp)))
                    results.setdefault(code, []).append(got)
                    print(
                        f"{code}: {args.jobs} jobs, submitted in {got['submitted_s']:.2f} s, all completed"
                        f" after {got['elapsed_s']:.2f} s: {got['rate']:.0f} jobs/s; scheduler CPU"
                        f" {got['cpu_ms']:.2f} ms a job",
                        flush=True,
                    )
    if args.rounds > 1:
        for code, runs in results.items():
            rates = [r["rate"] for r in runs]
            cpu = statistics.median(r["cpu_ms"] for r in runs)
            print(
                f"median {code}: {statistics.median(rates):.0f} jobs/s"
                f" ({', '.join(f'{x:.0f}' for x in rates)}), scheduler CPU {cpu:.2f} ms a job"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
