"""Backfill: EASY never delays the reserved job, conservative no reserved job, FIFO never backfills."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from builders import Log, allocated, cluster, exited, job, policy, submitted
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.libs.core import plan as plan_module
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.job_facts import Facts
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import Policy
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

EASY = policy()
CONSERVATIVE = dataclasses.replace(EASY, backfill="conservative")
FIFO = dataclasses.replace(EASY, backfill="fifo")


def busy_cluster() -> tuple[Log, float]:
    """Two 8-GPU nodes; job 1 holds all of gpu01 until t0 + 100 (its time limit)."""
    log = Log(*cluster(nodes=2, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=100)))
    log.add(allocated(1, {"gpu01": list(range(8))}, time_s=100))
    return log, log.state.jobs[1].start_time or 0.0


def run(log: Log, pol: Policy) -> Plan:
    out = plan(log.state, log.state.now, pol)
    log.add(*out.decisions, step=0.0)
    return out


def started(out: Plan) -> list[int]:
    return [d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)]


@pytest.mark.parametrize(
    ("pol", "expected_started"),
    [(EASY, [3]), (CONSERVATIVE, [3]), (FIFO, [])],
    ids=["easy", "conservative", "fifo"],
)
def test_a_short_job_slips_into_idle_gpus_while_the_big_job_waits(
    pol: Policy, expected_started: list[int]
) -> None:
    log, t1 = busy_cluster()
    log.add(
        submitted(2, job(gpus=8, nodes=2, time_s=1000)),  # the big training run: needs both nodes
        submitted(3, job(gpus=4, nodes=1, time_s=50)),  # a short eval: ends before gpu01 frees up
        submitted(4, job(gpus=4, nodes=1, time_s=5000)),  # a long job: would delay the big run
    )
    out = run(log, pol)
    assert started(out) == expected_started
    assert out.reasons[2] == "Resources" and out.reasons[4] == "Priority"
    if pol.backfill != "fifo":
        assert out.starts[2] == t1 + 100  # the big run's reservation: when job 1's limit ends


def two_blocked() -> Log:
    """gpu01 busy until +100, half of gpu02 until +300; job 2 (gpu01's 8 GPUs) and job 3 (both nodes) wait,
    job 4 fits gpu02 now but would delay job 3 (not job 2)."""
    log = Log(*cluster(nodes=2, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=100)), submitted(9, job(gpus=4, nodes=1, time_s=300)))
    log.add(
        allocated(1, {"gpu01": list(range(8))}, time_s=100),
        allocated(9, {"gpu02": [0, 1, 2, 3]}, time_s=300),
    )
    log.add(
        submitted(2, job(gpus=8, nodes=1, time_s=1000)),  # blocked: reserved on gpu01 when job 1 ends
        submitted(3, job(gpus=8, nodes=2, time_s=10)),  # second blocked: both nodes once job 2 ends
        submitted(4, job(gpus=4, nodes=1, time_s=2000)),  # fits gpu02 now; delays job 3, not job 2
    )
    return log


def test_easy_lets_a_job_delay_the_second_blocked_job_but_conservative_does_not() -> None:
    for pol, expected in ((EASY, [4]), (CONSERVATIVE, [])):
        out = run(two_blocked(), pol)
        assert started(out) == expected, pol.backfill
        assert (3 in out.starts) == (pol.backfill == "conservative")


@pytest.mark.parametrize(("depth", "expected"), [(1, [4]), (2, []), (None, [])], ids=["1", "2", "unbounded"])
def test_conservative_reserves_for_its_depths_first_blocked_jobs_and_backfills_around_them(
    depth: int | None, expected: list[int]
) -> None:
    """``backfill_depth`` (Slurm's bf_max_job_test): the first ``depth`` blocked jobs of a partition get
    their planned start; a later one waits for ``Priority`` without one, and a job may start now that
    delays it but none of the reserved ones."""
    out = run(two_blocked(), dataclasses.replace(CONSERVATIVE, backfill_depth=depth))
    assert started(out) == expected
    assert sorted(out.starts) == {1: [2], 2: [2, 3], None: [2, 3, 4]}[depth]
    assert (out.reasons[2], out.reasons[3]) == ("Resources", "Priority")


def test_a_reservation_waits_for_a_node_whose_window_closes_and_opens_again() -> None:
    """A node free now but held from +30 to +200 by a planned start fits a short job now, not from +30 on,
    and again from +200: a job needing it, and a node busy until +150, starts at +200 (the node's window
    opens again after the last of the others opened), not never."""
    log = Log(*cluster(nodes=3, gpus=8))
    log.add(
        submitted(1, job(gpus=8, nodes=1, time_s=150)),
        submitted(2, job(gpus=4, nodes=1, time_s=30)),
        submitted(3, job(gpus=4, nodes=1, time_s=40)),
        step=0.0,
    )
    log.add(
        allocated(1, {"gpu01": list(range(8))}, time_s=150),
        allocated(2, {"gpu02": [0, 1, 2, 3]}, time_s=30),
        allocated(3, {"gpu03": [0, 1, 2, 3]}, time_s=40),
        step=0.0,
    )
    t0 = log.state.now
    log.add(
        submitted(10, job(gpus=8, nodes=1, time_s=170)),  # reserved on gpu02 at +30, until +200
        submitted(11, job(gpus=4, nodes=3, time_s=20)),  # gpu01 from +150, gpu02 up to +10 and from +200
        step=0.0,
    )
    out = plan(log.state, t0, CONSERVATIVE)
    assert started(out) == []
    assert {job_id: start - t0 for job_id, start in out.starts.items()} == {10: 30.0, 11: 200.0}


#: Jobs as (nodes, GPUs per node, time limit).
Shapes = list[tuple[int, int, int]]


def queued(nodes: int, running: Shapes, queue: Shapes) -> Log:
    """``nodes`` 8-GPU nodes; jobs 1... submitted and each started if it fits (EASY), then 5 s later the
    queue, jobs 100...: a random busy cluster."""
    log = Log(*cluster(nodes=nodes, gpus=8))
    for i, (width, gpus, limit) in enumerate(running, start=1):
        log.add(submitted(i, job(gpus=gpus, nodes=width, time_s=limit)), step=0.0)
        log.add(*plan(log.state, log.state.now, EASY).decisions, step=0.0)
    log.add(step=5.0)
    for k, (width, gpus, limit) in enumerate(queue, start=100):
        log.add(submitted(k, job(gpus=gpus, nodes=width, time_s=limit)), step=0.0)
    return log


def shapes(widest: int, most: int) -> st.SearchStrategy[Shapes]:
    """Up to ``most`` jobs of 1 to ``widest`` nodes."""
    shape = st.tuples(st.integers(1, widest), st.sampled_from([1, 2, 4, 8]), st.integers(5, 400))
    return st.lists(shape, max_size=most)


@settings(max_examples=150, deadline=None)
@given(shapes(3, 5), shapes(3, 14))
def test_conservative_without_a_window_plans_a_start_for_every_blocked_job(
    running: Shapes, queue: Shapes
) -> None:
    """Every job fits the idle cluster and every run and reservation ends: with no window, each job that
    does not start now has a planned start."""
    log = queued(3, running, queue)
    out = plan(log.state, log.state.now, dataclasses.replace(CONSERVATIVE, backfill_window_s=None))
    pending = {j.job_id for j in log.state.jobs.values() if j.state == "PENDING"}
    assert pending - set(started(out)) == set(out.starts)


def test_a_finished_job_frees_its_reservation_holder_to_start() -> None:
    log, _ = busy_cluster()
    log.add(submitted(2, job(gpus=8, nodes=2, time_s=1000)))
    run(log, EASY)
    log.add(exited(1, "gpu01"))
    out = run(log, EASY)  # concludes job 1 and starts job 2 on what it frees
    assert isinstance(out.decisions[0], ev.JobCompleted) and started(out) == [2]


# --- property: backfilling never delays the job at the head of the queue --------------------------------


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 2), st.sampled_from([1, 2, 4, 8]), st.integers(5, 400)),
        min_size=2,
        max_size=10,
    ),
    st.sampled_from(["easy", "conservative"]),
)
def test_reservations_are_never_delayed(jobs: list[tuple[int, int, int]], mode: str) -> None:
    """Plan, then let every run last exactly its limit: the head of the queue starts no later than planned.

    Later reservations (conservative) may move when a job ahead of them starts on other nodes than
    planned: that is a job of higher priority, which may delay them. The head has nobody ahead.
    """
    pol = dataclasses.replace(EASY, backfill=mode)  # type: ignore[arg-type]
    log = Log(*cluster(nodes=2, gpus=8))
    for i, (nodes, gpus, limit) in enumerate(jobs, start=1):
        log.add(submitted(i, job(gpus=gpus, nodes=nodes, time_s=limit)), step=0.0)
    promised: dict[int, float] = {}
    for _ in range(200):
        out = run(log, pol)
        if out.starts:
            head = min(out.starts)  # equal priorities: queue order is submit order, i.e. job id
            promised.setdefault(head, out.starts[head])
        for job_id in started(out):
            if job_id in promised:
                assert log.state.now <= promised[job_id] + 1e-9, (job_id, promised[job_id], log.state.now)
        running = [j for j in log.state.jobs.values() if j.state == "RUNNING"]
        if not running and all(j.state != "PENDING" for j in log.state.jobs.values()):
            break
        if out.decisions:
            continue
        # Nothing to decide now: advance to the next end of a run (runs last their whole limit).
        soonest = min(running, key=lambda j: ((j.start_time or 0) + (j.time_limit_s or 0), j.job_id))
        end = (soonest.start_time or 0) + (soonest.time_limit_s or 0)
        # Every node of the run reports it (the batch node first), as the agents do.
        for alloc in soonest.allocations:
            log.append(_at(exited(soonest.job_id, alloc.node, attempt=soonest.restart_count), end))
    assert all(j.state == "COMPLETED" for j in log.state.jobs.values())


@settings(max_examples=40, deadline=None)
@given(shapes(2, 4), shapes(2, 12))
def test_conservative_of_depth_one_is_easy_and_of_the_queues_depth_is_unbounded(
    running: Shapes, queue: Shapes
) -> None:
    """One reservation a partition is EASY's plan, every decision, reason and planned start alike; a depth
    of at least the queue's length plans as textbook conservative (no bound)."""
    log = queued(2, running, queue)
    now = log.state.now
    one = plan(log.state, now, dataclasses.replace(CONSERVATIVE, backfill_depth=1))
    assert one == plan(log.state, now, EASY)
    pending = sum(j.state == "PENDING" for j in log.state.jobs.values())
    deep = plan(log.state, now, dataclasses.replace(CONSERVATIVE, backfill_depth=max(pending, 1)))
    assert deep == plan(log.state, now, CONSERVATIVE)


def _at(body: ev.Event, when: float) -> ev.Envelope:
    from builders import env

    return env(body, at=when)


@pytest.mark.parametrize(
    ("resolution", "expected_started", "reserved_at"),
    [(0, [], 30.0), (1, [], 30.0), (60, [3], 39.0), (7, [3], 35.0)],
    ids=["exact", "1s", "60s", "7s"],
)
def test_the_backfill_resolution_plans_ends_on_a_grid(
    resolution: int, expected_started: list[int], reserved_at: float
) -> None:
    """bf_resolution: a run's end, and a job's started now, is planned at the first multiple of the
    resolution at or after it (a grid fixed in time, as Slurm's), so a job ending in the same step as a
    reservation's start counts as ending with it (Slurm's accuracy-for-speed trade). Job 1 starts at
    1,700,000,001 (21 s past a multiple of 60, on one of 7) and ends 30 s later: planned at +39 s on the 60 s
    grid, +35 s on the 7 s one, where job 3 (35 s, ending 5 s after job 1) counts as ending with it and
    starts now."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=4, nodes=1, time_s=30)))
    log.add(allocated(1, {"gpu01": [0, 1, 2, 3]}, time_s=30), step=0.0)
    now = log.state.jobs[1].start_time or 0.0
    log.add(
        submitted(2, job(gpus=8, nodes=1, time_s=1000)),  # needs the whole node: reserved at job 1's end
        submitted(3, job(gpus=4, nodes=1, time_s=35)),  # free GPUs now, but ends after job 1 would
        step=0.0,
    )
    out = plan(log.state, now, dataclasses.replace(EASY, backfill_resolution_s=resolution))
    assert started(out) == expected_started
    assert out.starts[2] == now + reserved_at


def test_a_planned_start_stays_put_while_only_the_clock_moves() -> None:
    """squeue --start: with a resolution, a blocked job's planned start is the same in every cycle until
    something changes (the grid does not move with the time of the plan)."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=3600)))
    log.add(allocated(1, {"gpu01": list(range(8))}, time_s=3600), step=0.0)
    log.add(submitted(2, job(gpus=8, nodes=1, time_s=600)))
    start = log.state.jobs[1].start_time or 0.0
    pol = dataclasses.replace(EASY, backfill_resolution_s=60)
    planned = {plan(log.state, start + dt, pol).starts[2] for dt in (2.0, 7.0, 30.0, 61.0, 900.0)}
    assert planned == {math.ceil((start + 3600) / 60) * 60}
    assert all(type(t) is float for t in planned)  # a time, as every other the plan gives (encoded as one)


# --- property: a cycle's shortcut for requests already refused decides as the full path does ------------


class _NeverRefused(set[object]):
    """A ``Cycle.refused`` that never remembers: every job takes the full path."""

    def add(self, item: object) -> None:
        pass


class _FullPath(plan_module.Cycle):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = _NeverRefused()


SHAPES = st.tuples(st.integers(1, 3), st.sampled_from([0, 1, 2, 8]), st.sampled_from([30, 600, 3600]))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(SHAPES, min_size=1, max_size=6),  # running jobs (each starts if it fits, in order)
    st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=40),  # queue: a shape, held
    st.lists(SHAPES, min_size=1, max_size=6),  # the queue's shapes (few, so that many jobs share one)
    st.sampled_from(["easy", "conservative", "fifo"]),
)
def test_a_request_refused_earlier_in_the_cycle_decides_as_the_full_path(
    running: list[tuple[int, int, int]],
    queue: list[tuple[int, bool]],
    shapes: list[tuple[int, int, int]],
    mode: str,
) -> None:
    pol = dataclasses.replace(EASY, backfill=mode)  # type: ignore[arg-type]
    log = Log(*cluster(nodes=4, gpus=8, cpus=16))
    for i, (nodes, gpus, limit) in enumerate(running, start=1):
        log.add(submitted(i, job(gpus=gpus, nodes=nodes, time_s=limit)), step=0.0)
        log.add(*plan(log.state, log.state.now, pol).decisions, step=0.0)
    log.add(step=5.0)
    for k, (shape, held) in enumerate(queue, start=100):
        nodes, gpus, limit = shapes[shape % len(shapes)]
        log.add(submitted(k, job(gpus=gpus, nodes=nodes, time_s=limit)), step=0.0)
        if held:
            log.add(ev.JobHoldRequested(job_id=k, user="alice"), ev.JobHeld(job_id=k, by="alice"), step=0.0)
    shortcut = plan(log.state, log.state.now, pol)
    cache = CapacityCache()
    plan(log.state, log.state.now, pol, cache=cache)  # the jobs' facts kept, their refusal keys known
    kept = plan(log.state, log.state.now, pol, cache=cache)  # (a refused job then skips every call)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_module, "Cycle", _FullPath)
        full = plan(log.state, log.state.now, pol)
    assert shortcut == full == kept


def test_a_job_whose_request_the_cycle_refused_is_not_asked_again_once_its_facts_are_kept() -> None:
    """A deep queue of alike jobs on a full cluster: in a cycle with the jobs' facts kept, only the job that
    gets the reservation is asked for its request; every later one, refused by then, waits for ``Priority``
    at once."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=600)))
    log.add(*plan(log.state, log.state.now, EASY).decisions)
    for job_id in range(2, 52):
        log.add(submitted(job_id, job(gpus=8, nodes=1, time_s=600)), step=0.0)
    cache = CapacityCache()
    first = plan(log.state, log.state.now, EASY, cache=cache)
    asked: list[int] = []
    placed = Facts.placed

    def counting(facts: Facts, job: Any, policy: Policy) -> Any:
        asked.append(job.job_id)
        return placed(facts, job, policy)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Facts, "placed", counting)
        again = plan(log.state, log.state.now, EASY, cache=cache)
    assert again == first
    assert again.reasons[2] == "Resources" and again.reasons[3] == again.reasons[51] == "Priority"
    assert asked == [2]  # the head (its reservation); the 49 alike jobs behind it wait at once


@pytest.mark.parametrize("resolution", [0, 60, 7])
def test_a_job_started_in_a_cycle_is_planned_to_end_where_the_next_cycles_plan_its_run(
    resolution: int,
) -> None:
    """The cycle that starts a job plans its end as every later cycle plans the running job's (its exact
    end on the resolution's grid): the planned start of the job waiting for it is the same in both (squeue
    --start shows the leader's cycle's; a standby's answer, planned later, showed another)."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=610)))  # 610 s: not a multiple of the resolutions
    log.add(submitted(2, job(gpus=8, nodes=1, time_s=600)))
    pol = dataclasses.replace(EASY, backfill_resolution_s=resolution)
    now = log.at  # 22 s past a multiple of 60, 1 past one of 7
    first = plan(log.state, now, pol)
    assert started(first) == [1]
    log.add(*first.decisions, step=0.0)  # allocated at the plan's time
    later = plan(log.state, now + 5, pol)
    end = now + 610 if not resolution else math.ceil((now + 610) / resolution) * resolution
    assert first.starts[2] == later.starts[2] == end
