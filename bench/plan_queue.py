"""Benchmark: one ``plan()`` of a deep queue on a full cluster, as the scheduler makes it at each exit.

Usage: ``python bench/plan_queue.py [--jobs 10000] [--rounds 3] [--before DIR]``.

A cluster of 2 nodes x 4 CPUs runs 8 one-CPU jobs and ``--jobs`` more wait (50 users, one CPU each, 10
minutes): every cycle walks the whole queue and starts nothing, the case of a burst on a small cluster. The
cycle is timed with equal priorities (every weight 0, the default: FIFO order) and with multifactor priority
(age, fair share, job size), with the scheduler's ``CapacityCache`` kept across cycles and the cyclic GC
paused (``plan_paused``), as the service plans: the median of 15 plans after one that warms the cache. With
``--before DIR`` the same runs in a process that imports Corral from the checkout in DIR, alternating with
this one (``--rounds``), and the medians of both are printed side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = {
    "equal (default)": {},
    "multifactor": {"age": 1000, "fairshare": 10_000, "job_size": 1000, "max_age_s": 7 * 86400.0},
}


def measure(jobs: int) -> dict[str, float]:
    """Median ms of a plan for each weighting, in this process (whatever ``corral`` it imports)."""
    sys.path.insert(0, str(Path(os.environ.get("CORRAL_BENCH_ROOT", ROOT)) / "tests" / "unit"))
    import msgspec
    from builders import Log, cluster, job, policy, submitted

    from corral.libs.core.capacity import CapacityCache
    from corral.libs.core.plan import plan
    from corral.libs.core.priority import PriorityWeights
    from corral.services.scheduler.planning import plan_paused

    out = {}
    for name, weights in WEIGHTS.items():
        pol = dataclasses.replace(policy(), weights=PriorityWeights(**weights))  # type: ignore[arg-type]
        log = Log(*cluster(nodes=2, gpus=4, cpus=4))
        spec = msgspec.structs.replace(job(gpus=0, nodes=1), time_limit_s=600)
        for job_id in range(1, jobs + 9):
            log.add(submitted(job_id, spec, user=f"user{job_id % 50}"), step=0.01)
        cache = CapacityCache()
        for decision in plan(log.state, log.state.now, pol, cache=cache).decisions:
            log.add(decision, step=0.0)  # the first 8 start
        plan(log.state, log.state.now, pol, cache=cache)
        times = []
        for _ in range(15):
            started = time.perf_counter()
            result = plan_paused(log.state, log.state.now, pol, 0, cache)
            times.append((time.perf_counter() - started) * 1000)
            assert not result.decisions and len(result.reasons) == jobs
        out[name] = statistics.median(times)
    return out


def main() -> int:
    """Time this checkout (and DIR's, alternating), print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout of the code before")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.jobs)))
        return 0
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, root in (("before", args.before), ("after", ROOT)):
            if root is None:
                continue
            env = {**os.environ, "PYTHONPATH": str(root.resolve() / "src"), "CORRAL_BENCH_ROOT": str(root)}
            command = [sys.executable, __file__, "--child", "--jobs", str(args.jobs)]
            done = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd="/")
            runs[name].append(json.loads(done.stdout))
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(
        f"{args.jobs:,} pending jobs on 8 busy slots, {args.rounds} rounds, ms a plan (median of each round)"
    )
    print("| priority | " + " | ".join(name for name in runs if runs[name]) + " |")
    print("|---|" + "---|" * sum(1 for name in runs if runs[name]))
    for weighting in WEIGHTS:
        cells = [", ".join(f"{r[weighting]:.1f}" for r in rounds) for rounds in runs.values() if rounds]
        print(f"| {weighting} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
