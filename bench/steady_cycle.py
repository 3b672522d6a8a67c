"""Benchmark: a live scheduler's cycle on a large busy cluster when little has changed since the last one.

Usage: ``python bench/steady_cycle.py [--nodes 10000] [--pending 200] [--cycles 40] [--resolution 60]
[--before DIR]``.

The scheduler service plans after every batch of entries it folds, at ``time.time()``, with the nodes'
plans kept across cycles (``capacity.CapacityCache``); most cycles follow a few events on a cluster of
thousands of nodes. This builds the busy cluster of ``cluster_workload.py`` (``--nodes`` x 8 GPUs, ~80% of
the GPUs taken by ~``--nodes`` running jobs, ``--pending`` jobs queued), folds it, plans once with a cache,
then times two kinds of cycle, in process, with the cyclic GC paused as the service plans:

- **clock**: the same state planned again ``--cycles`` times, a second later each time (nothing folded);
- **exit**: before each cycle one running job's run exits on its nodes (``RunExited``, folded), and the
  cycle concludes it (its ``JobCompleted`` folded after).

Each line gives the median and the 95th percentile of a cycle in ms and the node plans the cycle built
again (``CapacityCache.replanned``, where the code has it), under ``--resolution`` (the scheduler's
``backfill_resolution``; the default configuration's is 60). With ``--before DIR`` (``git archive REV | tar
-x -C DIR``) the same runs first in a process importing Corral from DIR, so both are measured in one run.
Results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(nodes: int, pending: int, cycles: int, resolution: int) -> list[str]:
    """The two lines (clock, exit) for this process's code."""
    import dataclasses
    import gc
    import statistics

    from cluster_workload import NOW, build_log, config_text, meta

    from corral.libs.config.cluster import parse_config
    from corral.libs.config.policy import policy_of
    from corral.libs.core.capacity import CapacityCache
    from corral.libs.core.fold import apply, fold
    from corral.libs.core.plan import plan
    from corral.schemas import events as ev

    log, running = build_log(nodes, pending)
    state = fold(log)
    seq = len(log)
    del log
    gc.collect()
    gc.freeze()
    policy = dataclasses.replace(
        policy_of(parse_config(config_text(nodes))), backfill_resolution_s=resolution
    )
    cache = CapacityCache()
    plan(state, NOW, policy, cache=cache)

    def append(body: ev.Event, at: float, actor: str) -> None:
        nonlocal seq
        seq += 1
        apply(state, seq, ev.Envelope(meta=meta(seq, at, actor), body=body))

    def line(kind: str, times: list[float], rebuilt: list[int]) -> str:
        ms = sorted(t * 1e3 for t in times)
        p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))]
        plans = f"{statistics.median(rebuilt):,.0f} node plans built again" if rebuilt else "(not counted)"
        return f"{kind}: p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, {plans}"

    now = NOW
    out = []
    gc.disable()
    try:
        times, rebuilt = [], []
        for _ in range(cycles):
            now += 1.0
            started = time.perf_counter()
            plan(state, now, policy, cache=cache)
            times.append(time.perf_counter() - started)
            if hasattr(cache, "replanned"):
                rebuilt.append(cache.replanned)
        out.append(line("clock", times, rebuilt))
        times, rebuilt = [], []
        runs = [j for j in state.jobs.values() if j.state == "RUNNING"][:cycles]
        for job in runs:
            now += 1.0
            for alloc in job.allocations:
                append(
                    ev.RunExited(job_id=job.job_id, attempt=job.restart_count, node=alloc.node, exit_code=0),
                    now,
                    "agent",
                )
            started = time.perf_counter()
            decided = plan(state, now, policy, cache=cache)
            times.append(time.perf_counter() - started)
            if hasattr(cache, "replanned"):
                rebuilt.append(cache.replanned)
            for decision in decided.decisions:
                if isinstance(decision, ev.JobCompleted):
                    append(decision, now, "corral-scheduler")
        out.append(line("exit", times, rebuilt))
    finally:
        gc.enable()
    out.insert(0, f"{nodes:,} nodes, {running:,} running, {pending:,} pending, resolution {resolution} s")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--resolution", type=int, default=60)
    parser.add_argument("--before", type=Path, help="a checkout to measure first, in its own process")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # measure here, print lines
    args = parser.parse_args()
    if args.one:
        print("\n".join(measure(args.nodes, args.pending, args.cycles, args.resolution)))
        return 0
    from bench_clusters import trees_of  # (here: the child measuring the before's code does not load it)

    trees = trees_of(args)
    for name, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
        argv = [sys.executable, str(HERE / "steady_cycle.py"), "--one", "--nodes", str(args.nodes)]
        argv += [
            "--pending",
            str(args.pending),
            "--cycles",
            str(args.cycles),
            "--resolution",
            str(args.resolution),
        ]
        out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=True)
        print(f"{name}: " + out.stdout.strip().replace("\n", "\n  "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
