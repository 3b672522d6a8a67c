"""Benchmark: durable submissions per second through the gateway, from a concurrent API client.

Usage: ``python bench/api_throughput.py [--jobs 5000] [--before DIR] [--only NAME ...]``. Starts a local
cluster (2 nodes x 4 GPUs; with ``--before``, a second one whose services run the checkout in DIR, and the
scenarios alternate between the two) and runs each scenario of ``SCENARIOS`` against it
(``api_load.py``): one or several client processes, each with one NATS connection and N requests in
flight, sending ``submit`` requests (one job each) or ``submit_batch`` requests. The jobs are submitted held,
so that nothing runs: the scheduler and accounting still fold and project every submission, as they would.

A submission counts once the gateway has replied with its job id, which it does only after JetStream has
stored the entry (durable). Afterwards the bench reads each cluster's log and checks that every id replied is
there exactly once and that no id was given twice.

Prints a Markdown table: submissions/s, request latency p50/p95, and the CPU the gateways and NATS used per
1,000 jobs. Results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from api_load import Load, LoadResult, pct, run_load  # bench/ is this script's directory: on sys.path
from bench_clusters import BenchCluster, clusters

from corral.libs.infra import roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import api
from corral.schemas import events as ev

HERE = Path(__file__).resolve().parent
#: The processes that follow the log, stopped with ``--paused`` while the gateways are measured.
CONSUMERS = ("scheduler", "accounting", "feed")


@dataclass(frozen=True)
class Scenario:
    """One measurement."""

    name: str  # shown in the table
    gateways: int  # gateway processes serving
    clients: int  # client processes
    in_flight: int  # requests outstanding per client
    batch: int = 0  # jobs per submit_batch request (0: the submit verb)
    share: float = 1.0  # fraction of --jobs it sends


SCENARIOS = [
    Scenario("serial: 1 client, 1 in flight", 1, 1, 1, share=0.2),
    Scenario("1 client, 64 in flight", 1, 1, 64),
    Scenario("4 clients x 64 in flight", 1, 4, 64),
    Scenario("batch of 100, 1 client x 8 in flight", 1, 1, 8, batch=100, share=2.0),
    Scenario("4 clients x 64 in flight, 2 gateways", 2, 4, 64),
    Scenario("batch of 100, 2 clients x 8, 2 gateways", 2, 2, 8, batch=100, share=2.0),
]


async def logged_ids(bench: BenchCluster) -> Counter[int]:
    """How often each job id was submitted, from the cluster's log."""
    creds = read_credentials(bench.cluster.role_credentials(roles.ADMIN))
    nc = await connect(creds, name="bench-check")
    try:
        bus = Bus(nc, actor="bench")
        seen: Counter[int] = Counter()
        async for entry in bus.read(1, subject="corral.evt.job.*.job_submitted"):
            if entry.envelope is not None and isinstance(entry.envelope.body, ev.JobSubmitted):
                seen[entry.envelope.body.job_id] += 1
        return seen
    finally:
        await nc.drain()


def wait_caught_up(bench: BenchCluster, last_id: int, timeout: float = 900.0) -> None:
    """Wait until the scheduler and accounting know the newest job, so that a paused consumer's backlog does
    not fall into the next measurement (the feed catches up meanwhile too)."""
    from corral.cli.client import Cluster

    creds = read_credentials(bench.cluster.user_credentials)
    cluster = Cluster(url=creds.url, credentials=creds)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = cluster.call("jobs", api.JobsRequest(job_ids=[last_id]), api.JobsReply)
        acct = cluster.call("acct", api.AcctRequest(job_ids=[last_id], limit=1), api.AcctReply)
        if jobs.jobs and acct.jobs:
            return
        time.sleep(1.0)
    raise TimeoutError(f"{bench.name}: job {last_id} not folded and projected in {timeout:.0f} s")


def row(scenario: Scenario, bench: BenchCluster, result: LoadResult, cpu: dict[str, float]) -> str:
    """The table row of one measurement."""
    ms = [x * 1000 for x in result.latencies]
    per_k = 1000 / max(len(result.ids), 1) * 1000
    gateways = sum(v for k, v in cpu.items() if k.startswith("gateway")) * per_k
    nats = cpu.get("nats-server", 0.0) * per_k
    return (
        f"| {scenario.name} | {bench.name} | {len(result.ids)} | {result.rate:,.0f} | {pct(ms, 50):.1f} | "
        f"{pct(ms, 95):.1f} | {len(result.errors)} | {gateways:.0f} | {nats:.0f} |"
    )


def measure(
    bench: BenchCluster, scenario: Scenario, jobs: int, paused: bool
) -> tuple[LoadResult, dict[str, float]]:
    """Run one scenario on one cluster; its result and the CPU seconds each process used meanwhile. With
    ``paused``, the log's consumers (scheduler, accounting, feed) are stopped (SIGSTOP) meanwhile."""
    bench.add_gateways(scenario.gateways)
    load = Load(
        jobs=max(int(jobs * scenario.share), scenario.clients),
        clients=scenario.clients,
        in_flight=scenario.in_flight,
        batch=scenario.batch,
    )
    consumers = [p.proc for p in bench.cluster.processes if p.proc and p.name in CONSUMERS] if paused else []
    for proc in consumers:
        proc.send_signal(signal.SIGSTOP)
    try:
        before = bench.cpu()
        result = run_load(bench.cluster.user_credentials, load)
        after = bench.cpu()
    finally:
        for proc in consumers:
            proc.send_signal(signal.SIGCONT)
    if paused and result.ids:
        wait_caught_up(bench, max(result.ids))
    return result, {k: after[k] - before.get(k, 0.0) for k in after}


def main() -> int:
    """Run the scenarios and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5000, help="jobs per scenario (scaled by its share)")
    parser.add_argument("--before", type=Path, help="a checkout whose services run on a second cluster")
    parser.add_argument("--only", nargs="*", default=[], help="scenarios whose names contain one of these")
    parser.add_argument("--cpu", action="store_true", help="also print every process's CPU per 1,000 jobs")
    parser.add_argument(
        "--paused",
        action="store_true",
        help="stop the consumers of the log (scheduler, accounting, feed) while measuring",
    )
    args = parser.parse_args()
    trees = {"after": HERE.parent}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    chosen = [s for s in SCENARIOS if not args.only or any(o in s.name for o in args.only)]
    # Gateways are only ever added: the scenarios run in order of their gateway count.
    chosen.sort(key=lambda s: s.gateways)
    replied: dict[str, list[int]] = {}
    lines = [
        "| scenario | code | jobs | submissions/s | p50 ms | p95 ms | errors | gateway CPU ms / 1k jobs | "
        "NATS CPU ms / 1k jobs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with clusters(trees) as benches:
        for k, scenario in enumerate(chosen):
            # Alternate which cluster goes first, so neither always follows the other's backlog.
            for bench in benches if k % 2 == 0 else list(reversed(benches)):
                result, cpu = measure(bench, scenario, args.jobs, args.paused)
                replied.setdefault(bench.name, []).extend(result.ids)
                lines.append(row(scenario, bench, result, cpu))
                print(lines[-1], flush=True)
                if args.cpu:
                    per_k = 1000 * 1000 / max(len(result.ids), 1)
                    used = sorted(cpu.items(), key=lambda kv: -kv[1])
                    print(
                        "  CPU ms / 1k jobs: " + ", ".join(f"{k} {v * per_k:.0f}" for k, v in used if v > 0)
                    )
                if result.errors:
                    print(f"  {bench.name}: first errors: {sorted(set(result.errors))[:3]}", file=sys.stderr)
        for bench in benches:
            seen = asyncio.run(logged_ids(bench))
            ids = replied.get(bench.name, [])
            doubled = [i for i, n in Counter(ids).items() if n > 1]
            missing = [i for i in ids if seen[i] != 1]
            print(
                f"{bench.name}: {len(ids)} ids replied, {len(doubled)} given twice, {len(missing)} not in "
                f"the log exactly once; {sum(seen.values())} submissions in the log"
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
