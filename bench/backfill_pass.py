"""Benchmark: one scheduling pass (``plan()``) on a large, busy cluster with a deep queue.

    python bench/backfill_pass.py [--small] [--budget 300] [--profile-budget 120]

Builds the log of a cluster of 10,000 nodes x 8 GPUs in three partitions (``--small``: 1,000 nodes):
node registrations, running jobs (``JobSubmitted`` + ``JobAllocated``, about 80% of the GPUs busy,
single-node jobs of 1-8 GPUs and whole-node jobs of 2-64 nodes, time limits 10 min - 2 days) and
100,000 pending jobs (``--small``: 10,000) of the same kinds, all with deterministic ids and times.
Then it times the fold of that log and one ``plan()`` call per backfill policy (EASY, the default,
then textbook conservative (every blocked job reserved) and FIFO, then conservative at the configuration's
``backfill_depth``, Slurm's bf_max_job_test), then ``sbatch --test-only`` of a new job (``will_run``, as
the scheduler answers it), profiles the EASY pass (cProfile, top functions by cumulative
and own time) and prints Markdown tables with the machine. A finished pass's row ends with the digest of
what it decided (``digest``): a refactoring of the core must leave the digests unchanged.

Issue target: one full-depth backfill pass on 10,000 nodes x 8 GPUs with 100,000 pending jobs <= 1 s.

A pass that would run longer than ``--budget`` seconds is stopped (SIGALRM) and its full time is
extrapolated from the share of the queue it got through (a lower bound when later jobs cost more,
as they do for conservative backfill, whose reservations pile up).
The cluster and its jobs come from ``cluster_workload.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import gc
import hashlib
import io
import os
import platform
import pstats
import resource
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

import msgspec
from cluster_workload import (
    GPUS_PER_NODE,
    NOW,
    build_log,
    config_text,
    job_spec,
)

from corral.libs.config.cluster import parse_config
from corral.libs.core import plan as plan_module
from corral.libs.core.backfill import Planner
from corral.libs.core.fold import fold
from corral.libs.core.placement import Request
from corral.libs.core.plan import Plan
from corral.libs.core.policy import Backfill, Policy
from corral.libs.core.state import State
from corral.libs.core.will_run import will_run
from corral.schemas import events as ev
from corral.schemas.events import NodeAllocation
from corral.services.scheduler.planning import plan_paused
from corral.services.scheduler.views import policy_of

#: The passes timed: (row label, backfill mode, conservative's ``backfill_depth``: None is textbook
#: conservative, every blocked job reserved; ``CONFIGURED``, the configuration's default, Slurm's
#: bf_max_job_test).
CONFIGURED = -1
POLICIES: tuple[tuple[str, Backfill, int | None], ...] = (
    ("easy", "easy", None),
    ("conservative", "conservative", None),
    ("fifo", "fifo", None),
    ("conservative, configured depth", "conservative", CONFIGURED),
)


class OutOfTime(Exception):
    """The step ran past its budget."""


@contextlib.contextmanager
def budget(seconds: float) -> Iterator[None]:
    """Raise OutOfTime in this (main) thread after ``seconds``."""

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise OutOfTime

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class CountingPlanner(Planner):
    """The core's planner, counting the jobs it was asked about (progress of a pass that is stopped)."""

    considered = 0
    reservations = 0

    def start_now(self, partition: str, req: Request, limit: float) -> list[NodeAllocation] | None:
        CountingPlanner.considered += 1
        return super().start_now(partition, req, limit)

    def reserve(self, partition: str, req: Request, limit: float, window: float) -> float | None:
        CountingPlanner.reservations += 1
        return super().reserve(partition, req, limit, window)


@dataclass
class PassResult:
    """One timed ``plan()`` call."""

    policy: str  # the pass's label (the backfill policy)
    wall: float  # seconds (or seconds until stopped)
    finished: bool  # False: stopped at the budget
    considered: int  # jobs planned (start_now calls)
    reservations: int  # reserve calls
    plan: Plan | None  # the result when finished


def timed_pass(
    state: State, policy: Policy, budget_s: float, profiler: cProfile.Profile | None = None, label: str = ""
) -> PassResult:
    """Time one plan() call, stopping it after ``budget_s``."""
    CountingPlanner.considered = CountingPlanner.reservations = 0
    result: Plan | None = None
    started = time.perf_counter()
    try:
        with budget(budget_s):
            if profiler is not None:
                profiler.enable()
            try:
                result = plan_paused(state, NOW, policy, 0)  # as the scheduler service calls it
            finally:
                if profiler is not None:
                    profiler.disable()
    except OutOfTime:
        pass
    wall = time.perf_counter() - started
    return PassResult(
        label or policy.backfill,
        wall,
        result is not None,
        CountingPlanner.considered,
        CountingPlanner.reservations,
        result,
    )


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    """One line describing the machine."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    system = f"{platform.system()} {platform.release()} {platform.machine()}"
    return (
        f"nproc {len(os.sched_getaffinity(0))}, {mem_gib:.0f} GiB RAM, {system}, "
        f"Python {platform.python_version()}, msgspec {msgspec.__version__}"
    )


def row(step: str, wall: str, rate: str, notes: str, rss: float | None = None) -> str:
    """A Markdown table row with ``rss`` (negative: not measured), else this process's peak RSS so far."""
    peak = "-" if rss is not None and rss < 0 else f"{peak_rss_mib() if rss is None else rss:,.0f}"
    return f"| {step} | {wall} | {rate} | {peak} | {notes} |"


def profile_text(profiler: cProfile.Profile, sort: str, top: int) -> str:
    """The ``top`` functions of a profile by ``sort``, as pstats prints them (header trimmed)."""
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(sort).print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(line.rstrip() for line in lines[start:] if line.strip())


def digest(result: Plan) -> str:
    """A short hash of everything a pass decides: its decisions in order, every pending job's reason as
    squeue shows it, priorities and planned starts (equal before and after a change that keeps behaviour)."""
    reasons = sorted((job_id, result.reason_text(job_id)) for job_id in result.reasons)
    whole = [result.decisions, reasons, sorted(result.priorities.items()), sorted(result.starts.items())]
    return hashlib.sha256(msgspec.json.encode([*whole, result.wake_at])).hexdigest()[:16]


def pass_row(res: PassResult, pending: int) -> str:
    """A table row for one plan() call."""
    if res.finished and res.plan is not None:
        started = sum(isinstance(d, ev.JobAllocated) for d in res.plan.decisions)
        note = (
            f"{started:,} jobs started now, {len(res.plan.starts):,} reservations, digest {digest(res.plan)}"
        )
        return row(f"plan {res.policy}", f"{res.wall:.2f}", f"{pending / res.wall:,.0f} jobs/s", note)
    done = max(res.considered, 1)
    note = (
        f"stopped at the budget after {res.considered:,} of {pending:,} jobs"
        f" ({res.reservations:,} reservations); extrapolated full pass >= {res.wall * pending / done:,.0f} s"
    )
    return row(f"plan {res.policy}", f"> {res.wall:.0f}", f"{done / res.wall:,.0f} jobs/s", note)


WILL_RUN = "sbatch --test-only (will_run)"


def will_run_row(state: State, policy: Policy, budget_s: float) -> str:
    """``sbatch --test-only`` of a 2-node 8-GPU job in the default partition, as the scheduler answers it
    (``will_run`` with the policy made conservative, ``Scheduler.will_run_policy``), stopped at the budget."""
    spec = job_spec(0, "bench", None, 2, GPUS_PER_NODE, 3600, None, {})
    conservative = dataclasses.replace(policy, backfill="conservative")
    CountingPlanner.considered = CountingPlanner.reservations = 0
    started = time.perf_counter()
    try:
        with budget(budget_s):
            got = will_run(state, NOW, conservative, "bench", spec)
    except OutOfTime:
        wall = time.perf_counter() - started
        counts = f"{CountingPlanner.considered:,} jobs ({CountingPlanner.reservations:,} reservations)"
        return row(WILL_RUN, f"> {wall:.0f}", "-", f"stopped at the budget after {counts}")
    wall = time.perf_counter() - started
    start = "none" if got.start is None else f"in {got.start - NOW:,.0f} s"
    counts = f"{CountingPlanner.considered:,} jobs planned, {CountingPlanner.reservations:,} reservations"
    return row(WILL_RUN, f"{wall:.2f}", "-", f"{counts}; start {start}")


def main() -> int:
    """Build the cluster, fold it, time the passes and print the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="1,000 nodes and 10,000 pending jobs")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds before a pass is stopped")
    parser.add_argument("--profile-budget", type=float, default=120.0, help="seconds of EASY pass to profile")
    args = parser.parse_args()
    n_nodes, n_pending = (1_000, 10_000) if args.small else (10_000, 100_000)
    # The planner of plan() is the core's, with counters (plan.py imports the class by name).
    plan_module.Planner = CountingPlanner  # type: ignore[attr-defined]

    rows = ["| step | wall s | rate | peak RSS MiB | notes |", "|---|---|---|---|---|"]
    started = time.perf_counter()
    log, n_running = build_log(n_nodes, n_pending)
    wall = time.perf_counter() - started
    note = f"{len(log):,} envelopes: {n_nodes:,} nodes, {n_running:,} running + {n_pending:,} pending jobs"
    rows.append(row("build log", f"{wall:.2f}", f"{len(log) / wall:,.0f} events/s", note))

    started = time.perf_counter()
    state = fold(log)
    wall = time.perf_counter() - started
    total = sum(n.gpus for n in state.nodes.values())
    busy = sum(len(n.used_gpus) for n in state.nodes.values())
    running = sum(j.state == "RUNNING" for j in state.jobs.values())
    assert running == n_running, f"{n_running - running} running jobs were refused by the fold"
    note = f"{busy:,} of {total:,} GPUs busy ({busy / total:.1%})"
    rows.append(row("fold", f"{wall:.2f}", f"{len(log) / wall:,.0f} events/s", note))
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        fold(log)
        wall = time.perf_counter() - started
    finally:
        gc.enable()
    note = "same log, cyclic GC off during the fold"
    rows.append(row("fold, gc disabled", f"{wall:.2f}", f"{len(log) / wall:,.0f} events/s", note))
    # As the scheduler service after its rebuild: the log's envelopes are gone and the state is frozen out
    # of the cyclic GC's way (otherwise each collection during a pass rescans a million objects).
    del log
    gc.collect()
    gc.freeze()

    policy = policy_of(parse_config(config_text(n_nodes)))
    results = {}
    for label, mode, depth in POLICIES:
        depth = policy.backfill_depth if depth == CONFIGURED else depth
        if depth is not None:
            label = f"{label} ({depth})"
        chosen = dataclasses.replace(policy, backfill=mode, backfill_depth=depth)
        results[label] = timed_pass(state, chosen, args.budget, label=label)
        rows.append(pass_row(results[label], n_pending))
        print(rows[-1], file=sys.stderr, flush=True)

    rows.append(will_run_row(state, policy, args.budget))
    print(rows[-1], file=sys.stderr, flush=True)

    profiler = cProfile.Profile()
    profiled = timed_pass(state, policy, args.profile_budget, profiler)
    scope = (
        "the whole pass" if profiled.finished else f"the first {profiled.considered:,} of {n_pending:,} jobs"
    )

    easy = results["easy"]
    verdict = "met" if easy.finished and easy.wall <= 1.0 else "not met"
    print(f"## backfill_pass: {n_nodes:,} nodes x {GPUS_PER_NODE} GPUs, {n_pending:,} pending jobs\n")
    print(f"Machine: {machine()}\n")
    print("\n".join(rows))
    print(
        f"\nTarget (EASY pass <= 1 s, 10,000 nodes / 100,000 pending): {verdict} ({easy.wall:.2f} s here).\n"
    )
    print(
        f"cProfile of the EASY pass ({scope}, {profiled.wall:.1f} s under the profiler), top 10 cumulative:\n"
    )
    print("```\n" + profile_text(profiler, "cumulative", 10) + "\n```\n")
    print("Top 10 by own time:\n")
    print("```\n" + profile_text(profiler, "tottime", 10) + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
