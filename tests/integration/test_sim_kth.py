"""The simulator on the KTH-SP2 trace against a small, independent textbook simulation.

With priority by submit order, ``corral sim --policy easy`` must give every one of the 28,476 jobs
the start time of the textbook EASY algorithm (Mu'alem & Feitelson 2001), and ``--policy fifo``
that of plain FIFO. The reference below shares nothing with the core but the SWF parser: it counts
processors only, keeps one FIFO queue, and at each event time applies completions, then arrivals,
then makes one scheduling pass:

1. start jobs from the head of the queue while the head fits;
2. (EASY) the blocked head gets a reservation at the shadow time, the earliest time enough
   processors are free counting running jobs' requested times; the extra processors are those
   free then beyond what the head needs;
3. (EASY) in queue order, a later job that fits now starts if it ends by the shadow time, or else
   if it fits in the extra processors (which it then uses up).

The trace is ``$CORRAL_TRACES/KTH-SP2-1996-2.1-cln.swf`` or ``../shared/traces/`` beside the repo.
"""

from __future__ import annotations

import heapq
import os
from pathlib import Path

import pytest

from corral.libs.sim.engine import SimResult, simulate, unit_cluster
from corral.libs.sim.report import Metrics, bounded_slowdown, format_metrics, metrics
from corral.libs.sim.workload import SimJob, parse_swf

pytestmark = pytest.mark.integration

TRACES = Path(os.environ.get("CORRAL_TRACES") or Path(__file__).resolve().parents[3] / "shared" / "traces")
KTH = TRACES / "KTH-SP2-1996-2.1-cln.swf"
PROCESSORS = 100
#: As recorded on the production machine (EASY), from the traces' README.
PRODUCTION = {"mean_wait": 15_393.0, "mean_bounded_slowdown": 192.0, "utilisation": 0.70}


def textbook(jobs: list[SimJob], processors: int, easy: bool) -> dict[int, int]:
    """Start time of every job under textbook FIFO or EASY (the module docstring's rules)."""
    arrivals = sorted(jobs, key=lambda j: (j.submit, j.id))
    ends: list[tuple[int, int]] = []  # (actual end, id)
    running: dict[int, tuple[int, int]] = {}  # id -> (expected end = start + requested time, processors)
    queue: list[SimJob] = []
    starts: dict[int, int] = {}
    free, i = processors, 0

    def start(job: SimJob, now: int) -> None:
        nonlocal free
        free -= job.units
        starts[job.id] = now
        running[job.id] = (now + (job.req_time or 0), job.units)
        heapq.heappush(ends, (now + job.run_time, job.id))

    while i < len(arrivals) or ends:
        now = min(arrivals[i].submit if i < len(arrivals) else ends[0][0], ends[0][0] if ends else 1 << 62)
        while ends and ends[0][0] == now:
            free += running.pop(heapq.heappop(ends)[1])[1]
        while i < len(arrivals) and arrivals[i].submit == now:
            queue.append(arrivals[i])
            i += 1
        head = 0
        while head < len(queue) and queue[head].units <= free:
            start(queue[head], now)
            head += 1
        queue = queue[head:]
        if not easy or not queue:
            continue
        # Shadow time: when enough processors are free for the head; extra: all free then beyond its need
        # (every job expected to end by the shadow time counts, including those ending exactly then).
        shadow, avail = 0, free
        for expected_end, units in sorted(running.values()):
            if avail >= queue[0].units and expected_end > shadow:
                break
            avail += units
            shadow = expected_end
        extra = avail - queue[0].units
        waiting = [queue[0]]
        for job in queue[1:]:
            if job.units <= free and now + (job.req_time or 0) <= shadow:
                start(job, now)
            elif job.units <= min(free, extra):
                start(job, now)
                extra -= job.units
            else:
                waiting.append(job)
        queue = waiting
    return starts


def textbook_metrics(jobs: list[SimJob], starts: dict[int, int], processors: int) -> Metrics:
    """Mean wait, mean bounded slowdown and utilisation of a reference schedule (other fields 0)."""
    waits = [starts[j.id] - j.submit for j in jobs]
    makespan = max(starts[j.id] + j.run_time for j in jobs) - min(j.submit for j in jobs)
    return Metrics(
        jobs=len(jobs),
        mean_wait=sum(waits) / len(jobs),
        p50_wait=0.0,
        p95_wait=0.0,
        max_wait=0.0,
        mean_bounded_slowdown=sum(bounded_slowdown(w, j.run_time) for w, j in zip(waits, jobs, strict=True))
        / len(jobs),
        utilisation=sum(j.run_time * j.units for j in jobs) / (processors * makespan),
        makespan=makespan,
    )


@pytest.fixture(scope="module")
def kth() -> list[SimJob]:
    """The KTH-SP2 jobs."""
    if not KTH.exists():
        pytest.skip(f"KTH-SP2 trace not found at {KTH} (set CORRAL_TRACES to its directory)")
    return parse_swf(KTH.read_text(), str(KTH))


def _differences(result: SimResult, expected: dict[int, int]) -> list[str]:
    return [
        f"job {r.id}: corral starts it at {r.start:g}, the textbook at {expected[r.id]}"
        for r in result.records
        if r.start != expected[r.id]
    ]


def _sane(m: Metrics, backfill: bool) -> None:
    """Every job ran and the load is the trace's; with backfill, waits of the production's order."""
    assert m.jobs == 28_476
    assert 0.60 <= m.utilisation <= 0.80
    if backfill:
        assert PRODUCTION["mean_wait"] / 5 <= m.mean_wait <= PRODUCTION["mean_wait"] * 5
        assert (
            PRODUCTION["mean_bounded_slowdown"] / 5
            <= m.mean_bounded_slowdown
            <= PRODUCTION["mean_bounded_slowdown"] * 5
        )


@pytest.mark.parametrize("policy", ["fifo", "easy"])
def test_corral_sim_equals_the_textbook_schedule(kth: list[SimJob], policy: str) -> None:
    expected = textbook(kth, PROCESSORS, easy=policy == "easy")
    result = simulate(kth, unit_cluster(PROCESSORS), "easy" if policy == "easy" else "fifo")
    print(f"\nKTH-SP2, {policy}: corral sim\n{format_metrics(metrics(result))}")
    print(f"production (EASY) as recorded: {PRODUCTION}")
    differences = _differences(result, expected)
    assert not differences, f"{len(differences)} of {len(kth)} jobs differ, e.g. {differences[:5]}"
    _sane(metrics(result), backfill=policy == "easy")


def test_the_textbook_easy_reproduces_sensible_numbers(kth: list[SimJob]) -> None:
    """The reference itself: EASY beats FIFO and lands near the production machine's utilisation."""
    easy = textbook_metrics(kth, textbook(kth, PROCESSORS, easy=True), PROCESSORS)
    fifo = textbook_metrics(kth, textbook(kth, PROCESSORS, easy=False), PROCESSORS)
    print(f"\ntextbook EASY: {easy}\ntextbook FIFO: {fifo}\nproduction: {PRODUCTION}")
    _sane(easy, backfill=True)
    _sane(fifo, backfill=False)
    assert easy.mean_wait < fifo.mean_wait / 2
    assert easy.mean_bounded_slowdown < fifo.mean_bounded_slowdown / 2
