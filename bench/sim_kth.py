"""Benchmark: ``corral sim`` on the KTH-SP2 trace (28,476 jobs, 100 processors), wall seconds per policy.

    python bench/sim_kth.py [--policy easy --policy fifo] [--limit N] [--profile]

Times the engine alone (the trace is parsed once, outside the timing) and prints one line per
policy with the wall time, plan() cycles and the headline metrics. ``--profile`` also prints the
functions with the most cumulative time (cProfile). The trace is found in ``$CORRAL_TRACES`` or
``../shared/traces`` beside the repository.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

from corral.libs.sim.engine import simulate, unit_cluster
from corral.libs.sim.report import metrics
from corral.libs.sim.workload import parse_swf

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("CORRAL_TRACES") or ROOT.parent / "shared" / "traces")
KTH = TRACES / "KTH-SP2-1996-2.1-cln.swf"


def main() -> int:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", choices=("fifo", "easy", "conservative"))
    parser.add_argument("--limit", type=int, help="only the first N jobs")
    parser.add_argument("--profile", action="store_true", help="print the top functions by cumulative time")
    args = parser.parse_args()
    if not KTH.exists():
        print(f"sim_kth: trace not found at {KTH} (set CORRAL_TRACES)", file=sys.stderr)
        return 1
    jobs = parse_swf(KTH.read_text(), str(KTH))[: args.limit]
    for policy in args.policy or ["easy", "fifo"]:
        profiler = cProfile.Profile() if args.profile else None
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = simulate(jobs, unit_cluster(100), policy)
        if profiler is not None:
            profiler.disable()
        wall = time.perf_counter() - started
        m = metrics(result)
        print(
            f"{policy:<12} {len(jobs)} jobs  {wall:7.2f} s  {result.cycles} cycles  mean wait "
            f"{m.mean_wait:.0f} s  mean bsld {m.mean_bounded_slowdown:.1f}  util {m.utilisation:.3f}",
            flush=True,
        )
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
