"""Benchmark: the scheduler's state over a log of jobs that ran and ended, with and without MinJobAge.

    python bench/retention.py [--jobs 200000] [--rate 50]

Builds a log of ``--jobs`` one-GPU jobs on 400 nodes of 8 GPUs, each submitted, allocated, started, exited and
completed (five entries a job, ``--rate`` jobs a second of log time, each running 60 s), and folds it (the
entries decoded slim, as the scheduler's rebuild does) twice: into ``State()`` with every ended job kept
(``min_job_age`` 0, what the scheduler did before) and into the scheduler's default (300 s). Reports, for
each: the fold's wall time, the jobs the state holds at the end, its memory (``tracemalloc``, the state
alone, from a second, traced fold), and its snapshot (``services/scheduler/snapshot.py``): bytes, encode +
compress and decode seconds.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
import tracemalloc

import msgspec

from corral.libs.core.fold import fold
from corral.libs.core.state import State
from corral.schemas import codec
from corral.schemas import events as ev
from corral.services.scheduler import snapshot

T0 = 1_800_000_000.0
NODES = 400  # 3,200 GPUs: a job's GPU is free again before the index comes round
RUN_S = 60.0


def log(jobs: int, rate: float) -> list[tuple[int, ev.Envelope]]:
    """The entries, slim-decoded, in time order."""
    raw: list[tuple[float, ev.Event]] = []
    for k in range(NODES):
        raw.append(
            (T0 - 1, ev.NodeRegistered(node=f"n{k:03d}", cpus=64, mem_mb=512_000, gpus=8, partitions=["gpu"]))
        )
    spec = ev.JobSpec(
        name="train", script="#!/bin/sh\ntrue\n", workdir="/home/u/run", gpus_per_node=1, partition="gpu"
    )
    for i in range(jobs):
        job_id, start = i + 1, T0 + i / rate
        node, gpu = f"n{i % NODES:03d}", (i // NODES) % 8
        alloc = ev.NodeAllocation(node=node, gpus=[gpu], cpus=1, mem_mb=1000)
        raw += [
            (start, ev.JobSubmitted(job_id=job_id, user=f"u{i % 40:02d}", spec=spec)),
            (
                start,
                ev.JobAllocated(
                    job_id=job_id, attempt=0, partition="gpu", allocations=[alloc], time_limit_s=3600
                ),
            ),
            (start, ev.RunStarted(job_id=job_id, attempt=0, node=node, pid=1000)),
            (start + RUN_S, ev.RunExited(job_id=job_id, attempt=0, node=node, exit_code=0)),
            (start + RUN_S, ev.JobCompleted(job_id=job_id, attempt=0)),
        ]
    raw.sort(key=lambda item: item[0])  # (stable: each job's entries keep their order)
    out = []
    for seq, (at, body) in enumerate(raw, 1):
        envelope = codec.envelope(body, actor="bench", occurred_at=at, event_id=f"{seq:032x}")
        out.append((seq, codec.decode_slim_envelope(codec.encode(envelope))))
    return out


def measure(entries: list[tuple[int, ev.Envelope]], age: float) -> dict[str, float]:
    gc.collect()
    gc.disable()
    started = time.perf_counter()
    state = fold(entries, State(min_job_age_s=age))
    wall = time.perf_counter() - started
    del state
    gc.collect()
    tracemalloc.start()  # (a second fold, traced: tracing slows it)
    state = fold(entries, State(min_job_age_s=age))
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert all(job.state == "COMPLETED" for job in state.jobs.values())
    started = time.perf_counter()
    data = snapshot.compress(
        snapshot.encode(snapshot.Snapshot(format=snapshot.FORMAT, event_id="e", state=state))
    )
    encode_s = time.perf_counter() - started
    started = time.perf_counter()
    decoded = snapshot.decode(data)
    decode_s = time.perf_counter() - started
    assert len(decoded.state.jobs) == len(state.jobs)
    gc.enable()
    return {
        "fold_s": wall,
        "jobs": len(state.jobs),
        "mib": memory / 2**20,
        "snapshot_mib": len(data) / 2**20,
        "encode_s": encode_s,
        "decode_s": decode_s,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs a second of log time")
    args = parser.parse_args()
    print(f"building {args.jobs:,} jobs ({5 * args.jobs:,} entries)", file=sys.stderr, flush=True)
    entries = log(args.jobs, args.rate)
    print(f"## retention: {args.jobs:,} ended jobs, {len(entries):,} entries, {args.rate:g} jobs/s\n")
    print(
        f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"msgspec {msgspec.__version__}\n"
    )
    print("| min_job_age | fold s | jobs held at the end | state MiB | snapshot MiB | encode s | decode s |")
    print("|---|---|---|---|---|---|---|")
    for age in (0.0, 300.0):
        row = measure(entries, age)
        label = "0 (every job kept, before)" if not age else f"{age:g} s"
        print(
            f"| {label} | {row['fold_s']:.2f} | {row['jobs']:,} | {row['mib']:,.1f}"
            f" | {row['snapshot_mib']:,.1f} | {row['encode_s']:.2f} | {row['decode_s']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
