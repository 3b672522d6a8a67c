"""Benchmark: the feed service projecting a log it is behind on (a start, or a burst), until the feed holds
every message.

Usage: ``python bench/feed_catchup.py [--jobs 3000] [--before DIR]``.

Starts a nats-server (from the pip-installed binary, temporary storage), appends ``--jobs`` trivial job
lifecycles to the log (submitted, allocated, completed: three entries and three feed messages each, after a
node registration), then runs one ``FeedService`` in a child process until the feed stream holds every
message, and prints the wall seconds, the messages a second and the service's CPU a message (``/proc``).
With ``--before DIR`` (``git archive REV | tar -x -C DIR``) the same runs first with DIR's code on its own
log and server, so both are measured in one run. Results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PASSWORD = "bench-pw"


async def feed_child(url: str) -> None:
    """The feed service until it is killed (the child process's life)."""
    from corral.libs.infra import roles
    from corral.libs.runtime.bus import Bus
    from corral.libs.runtime.credentials import Credentials
    from corral.libs.runtime.streams import connect
    from corral.services.feed.app import FeedService

    nc = await connect(Credentials(url=url, user=roles.ADMIN, password=PASSWORD), name="bench-feed")
    await FeedService(Bus(nc, actor=roles.FEED)).run(asyncio.Event())


async def measure(jobs: int, tree: Path) -> str:
    from bench_clusters import cpu_seconds  # (here: the feed's child process does not load it)

    from corral.libs.infra import roles
    from corral.libs.infra.nats_server import NatsServer
    from corral.libs.runtime.bus import Bus
    from corral.libs.runtime.credentials import Credentials
    from corral.libs.runtime.streams import connect, declare
    from corral.schemas import events as ev
    from corral.schemas import subjects
    from corral.schemas.job_spec import JobSpec

    with tempfile.TemporaryDirectory(prefix="corral-feedbench-") as tmp:
        server = NatsServer(Path(tmp), [roles.service_user(roles.ADMIN, PASSWORD)])
        server.start()
        try:
            nc = await connect(Credentials(url=server.url, user=roles.ADMIN, password=PASSWORD), name="bench")
            await declare(nc.jetstream())
            bus = Bus(nc, actor=roles.ADMIN)
            # (As many CPUs as jobs: the lifecycles are appended 100 at a time, each allocation must fit.)
            await bus.append(ev.NodeRegistered(node="node1", cpus=jobs, mem_mb=1024, partitions=["gpu"]))
            spec = JobSpec(name="t", script="#!/bin/sh\ntrue\n", workdir="/tmp", account="ml")
            node = ev.NodeAllocation(node="node1", gpus=[], cpus=1)

            async def lifecycle(job_id: int) -> None:
                await bus.append(ev.JobSubmitted(job_id=job_id, user="alice", spec=spec))
                allocated = ev.JobAllocated(
                    job_id=job_id, attempt=0, partition="gpu", allocations=[node], time_limit_s=None
                )
                await bus.append(allocated)
                await bus.append(ev.JobCompleted(job_id=job_id, attempt=0))

            for first in range(1, jobs + 1, 100):
                await asyncio.gather(*(lifecycle(j) for j in range(first, min(first + 100, jobs + 1))))
            env = {**os.environ, "PYTHONPATH": str(tree)}
            argv = [sys.executable, str(HERE / "feed_catchup.py"), "--child", server.url]
            started = time.perf_counter()
            child = subprocess.Popen(argv, env=env, cwd=tree)
            want = 3 * jobs
            try:
                while (await nc.jetstream().stream_info(subjects.FEED_STREAM)).state.messages < want:
                    assert child.poll() is None, "the feed service ended"
                    await asyncio.sleep(0.05)
                wall = time.perf_counter() - started
                used = cpu_seconds(child.pid)
            finally:
                child.kill()
                child.wait()
            await nc.close()
        finally:
            server.stop()
    return (
        f"{want:,} messages in {wall:.2f} s ({want / wall:,.0f}/s), the service's CPU "
        f"{used / want * 1e6:.0f} us a message (its start included)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--before", type=Path, help="a checkout to measure first, with its own server")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # run the feed service on this server's URL
    args = parser.parse_args()
    if args.child:
        asyncio.run(feed_child(args.child))
        return 0
    from bench_clusters import trees_of  # (here: the child measuring the before's code does not load it)

    trees = trees_of(args)
    print(f"feed catching up on {args.jobs:,} job lifecycles")
    for name, tree in trees.items():
        print(f"{name}: {asyncio.run(measure(args.jobs, tree))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
