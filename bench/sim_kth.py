"""Benchmark: ``corral sim`` on the KTH-SP2 trace (28,476 jobs, 100 processors), wall seconds per policy.

    python bench/sim_kth.py [--policy easy --policy fifo] [--limit N] [--profile] [--digest] [--multifactor]

Times the engine alone (the trace is parsed once, outside the timing) and prints one line per
policy with the wall time, CPU time, plan() cycles and the headline metrics. ``--profile`` also prints the
functions with the most cumulative time (cProfile). The trace is found in ``$CORRAL_TRACES`` or
``../shared/traces`` beside the repository.

``--digest`` is the planner's decision check: it hashes every ``plan()`` output of the run (the decisions in
order, and the reasons, details, priorities and planned starts by job id, the wake time and the plan's
time) into one digest per policy, so that a change to the planner can show it decides exactly as before
(the same digest before and after; ``bench/RESULTS.md`` records main's). The hashing is outside the timing's
purpose: a run with ``--digest`` is not a timing.

``--multifactor`` ranks the queue by multifactor priority (``MULTIFACTOR``: age, fair share among the trace's
users, job size) instead of the default's equal priorities (FIFO order), so that the digest covers the
priority computation too; its schedule is not textbook EASY's.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from corral.libs.core.plan import Plan
from corral.libs.core.policy import Policy
from corral.libs.core.priority import PriorityWeights
from corral.libs.sim import engine
from corral.libs.sim.engine import simulate, unit_cluster
from corral.libs.sim.report import metrics
from corral.libs.sim.workload import parse_swf

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("CORRAL_TRACES") or ROOT.parent / "shared" / "traces")
KTH = TRACES / "KTH-SP2-1996-2.1-cln.swf"
#: ``--multifactor``'s weights: a week's wait counts as much as a tenth of the fair share.
MULTIFACTOR = PriorityWeights(age=1000, fairshare=10_000, job_size=1000, max_age_s=7 * 86400.0)


class Digest:
    """``engine.plan`` wrapped: every output it returns is hashed, in call order."""

    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=8)
        self._encoder = msgspec.msgpack.Encoder()
        self._plan = engine.plan

    def __enter__(self) -> Digest:
        engine.plan = self  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        engine.plan = self._plan

    def __call__(self, *args: Any, **kwargs: Any) -> Plan:
        out: Plan = self._plan(*args, **kwargs)
        by_job = [sorted(d.items()) for d in (out.reasons, out.details, out.priorities, out.starts)]
        self.hash.update(self._encoder.encode([out.decisions, *by_job, out.wake_at, out.at]))
        return out


def main() -> int:
    """Run the benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", choices=("fifo", "easy", "conservative"))
    parser.add_argument("--limit", type=int, help="only the first N jobs")
    parser.add_argument("--profile", action="store_true", help="print the top functions by cumulative time")
    parser.add_argument("--digest", action="store_true", help="hash every plan() output (the decision check)")
    parser.add_argument(
        "--multifactor", action="store_true", help="rank by multifactor priority (MULTIFACTOR)"
    )
    args = parser.parse_args()
    if not KTH.exists():
        print(f"sim_kth: trace not found at {KTH} (set CORRAL_TRACES)", file=sys.stderr)
        return 1
    jobs = parse_swf(KTH.read_text(), str(KTH))[: args.limit]
    cluster = unit_cluster(100)
    if args.multifactor:
        policy = Policy(partitions=cluster.partitions, cluster="sim", weights=MULTIFACTOR)
        cluster = dataclasses.replace(cluster, policy=policy)
    for policy in args.policy or ["easy", "fifo"]:
        profiler = cProfile.Profile() if args.profile else None
        digest = Digest() if args.digest else None
        started, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        if digest is not None:
            with digest:
                result = simulate(jobs, cluster, policy)
        else:
            result = simulate(jobs, cluster, policy)
        if profiler is not None:
            profiler.disable()
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        m = metrics(result)
        print(
            f"{policy:<12} {len(jobs)} jobs  {wall:7.2f} s  (CPU {cpu:.2f} s)  {result.cycles} cycles"
            f"  mean wait {m.mean_wait:.0f} s"
            f"  mean bsld {m.mean_bounded_slowdown:.1f}  util {m.utilisation:.3f}"
            + (f"  plan digest {digest.hash.hexdigest()}" if digest is not None else ""),
            flush=True,
        )
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
