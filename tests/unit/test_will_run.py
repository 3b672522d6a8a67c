"""sbatch --test-only: the start a job would get if it were submitted now, without changing the state."""

from __future__ import annotations

import dataclasses

import pytest
from builders import Log, allocated, cluster, job, policy, submitted

from corral.libs.core import plan as plan_module
from corral.libs.core.state import encode_state
from corral.libs.core.will_run import will_run

pytestmark = pytest.mark.unit


def busy() -> tuple[Log, float]:
    """Two 8-GPU nodes; job 1 holds gpu01 until t1 + 100; job 2 (both nodes) waits for it."""
    log = Log(*cluster(nodes=2, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=100)))
    log.add(allocated(1, {"gpu01": list(range(8))}, time_s=100))
    t1 = log.state.jobs[1].start_time or 0.0
    log.add(submitted(2, job(gpus=8, nodes=2, time_s=1000)))
    return log, t1


@pytest.mark.parametrize(
    ("spec", "starts_in", "nodes", "reason"),
    [
        # Fits on gpu02 and ends before job 2's reservation (t1 + 100): it would start at once.
        (job(gpus=4, nodes=1, time_s=50), 0.0, ["gpu02"], ""),
        # Would delay job 2: after job 2's run, planned conservatively (EASY would give no start).
        (job(gpus=4, nodes=1, time_s=5000), 1100.0, [], "Priority"),
        # Both nodes: after job 2 too.
        (job(gpus=8, nodes=2, time_s=10), 1100.0, [], "Priority"),
    ],
    ids=["backfills-now", "after-the-queue", "whole-cluster"],
)
def test_the_estimate_is_what_the_next_cycle_would_decide(
    spec: object, starts_in: float, nodes: list[str], reason: str
) -> None:
    log, t1 = busy()
    now = log.state.now
    before = encode_state(log.state)
    got = will_run(log.state, now, policy(), "bob", spec)  # type: ignore[arg-type]
    assert encode_state(log.state) == before  # the state is left as it was
    assert got.job_id == 3
    expected = now if starts_in == 0.0 else t1 + starts_in
    assert got.start is not None and got.start - expected == pytest.approx(0.0, abs=1e-6)
    assert (got.nodes, got.reason) == (nodes, reason)


@pytest.mark.parametrize("backfill", ["easy", "conservative"])
@pytest.mark.parametrize(("depth", "starts_in"), [(1, 1100.0), (2, 1600.0), (None, 1600.0)])
def test_a_job_past_the_backfill_depth_gets_its_start_after_the_reserved_ones(
    backfill: str, depth: int | None, starts_in: float
) -> None:
    """The first ``backfill_depth`` blocked jobs ahead get their reservations, as in the cycles, and so does
    the asked job however deep it is; a blocked job ahead past the depth has none to wait for."""
    log, t1 = busy()
    log.add(submitted(3, job(gpus=8, nodes=2, time_s=500)))  # blocked behind job 2
    shallow = dataclasses.replace(policy(), backfill=backfill, backfill_depth=depth)
    got = will_run(log.state, log.state.now, shallow, "bob", job(gpus=8, nodes=2, time_s=10))
    assert got.start is not None
    assert got.start - t1 == pytest.approx(starts_in)  # after job 2 (1,000 s), and job 3 (500 s) if reserved
    assert got.reason == "Priority"


def test_a_job_asking_what_a_job_past_the_depth_asked_still_gets_its_start() -> None:
    """The cycle remembers a request refused once the depth is used up (later jobs asking the same wait
    without the planner's calls); the asked job is planned anyway."""
    log, t1 = busy()
    log.add(submitted(3, job(gpus=8, nodes=2, time_s=500)))  # past the depth: its request is refused
    shallow = dataclasses.replace(policy(), backfill="conservative", backfill_depth=1)
    got = will_run(log.state, log.state.now, shallow, "bob", job(gpus=8, nodes=2, time_s=500))
    assert got.start is not None and got.start - t1 == pytest.approx(1100.0)


def test_a_plan_until_a_job_under_fifo_does_not_start_it_behind_a_blocked_one() -> None:
    """``until`` lifts the reservation bound only: FIFO's first blocked job still stops the ones behind."""
    log, _ = busy()
    log.add(submitted(3, job(gpus=4, nodes=1, time_s=50)))  # fits gpu02 now, behind blocked job 2
    fifo = dataclasses.replace(policy(), backfill="fifo")
    outlook = plan_module.plan(log.state, log.state.now, fifo, until=3)
    assert outlook.decisions == [] and outlook.reasons[3] == "Priority"


def test_a_plan_until_a_job_stops_at_it() -> None:
    """Jobs behind the asked one cannot change its estimate: ``plan(until=...)`` considers none of them."""
    log, t1 = busy()
    log.add(submitted(3, job(gpus=4, nodes=1, time_s=50)))  # would backfill now on gpu02
    outlook = plan_module.plan(log.state, log.state.now, policy(), until=2)
    assert set(outlook.priorities) == {2} and outlook.decisions == []
    assert [(job_id, start - t1) for job_id, start in outlook.starts.items()] == [(2, pytest.approx(100.0))]


def test_a_job_that_would_wait_reports_the_cpus_the_placement_would_take() -> None:
    log, _ = busy()
    # Two nodes, one task each, --cpus-per-gpu=2 with 8 GPUs: 16 CPUs per node, 32 in all (not 2 x 1).
    spec = job(gpus=8, nodes=2, cpus_per_gpu=2, time_s=10)
    got = will_run(log.state, log.state.now, policy(), "bob", spec)
    assert got.start is not None and got.nodes == [] and got.cpus == 32


def test_a_held_job_gets_no_start() -> None:
    log, _ = busy()
    got = will_run(log.state, log.state.now, policy(), "bob", job(gpus=1, nodes=1, time_s=10, held=True))
    assert got.start is None and got.reason == "JobHeldUser"
