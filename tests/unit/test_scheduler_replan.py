"""Which folded entries ask the scheduler for a new plan (``app.replans``)."""

from __future__ import annotations

import pytest

from corral.schemas import events as ev
from corral.services.scheduler.app import replans

pytestmark = pytest.mark.unit

ALLOCATED = ev.JobAllocated(
    job_id=1,
    attempt=0,
    partition="p",
    allocations=[ev.NodeAllocation(node="n1", gpus=[0], cpus=1, mem_mb=100)],
    time_limit_s=60,
    epoch=3,
)


def test_own_decisions_the_plan_counted_and_runs_starting_ask_for_no_plan() -> None:
    assert not replans(ALLOCATED, applied=True, epoch=3)
    assert not replans(ev.JobCompleted(job_id=1, attempt=0, epoch=3), applied=True, epoch=3)
    assert not replans(ev.JobReasonChanged(job_id=1, attempt=0, reason="Priority", epoch=3), True, 3)
    assert not replans(ev.RunStarted(job_id=1, attempt=0, node="n1", pid=9), applied=True, epoch=3)


def test_everything_else_asks_for_one() -> None:
    # Another epoch's decision, or one the fold did not apply: the plan's assumption did not hold.
    assert replans(ALLOCATED, applied=True, epoch=4)
    assert replans(ALLOCATED, applied=False, epoch=3)
    # Decisions whose effect a plan does not count in the cycle that makes them, and every other writer's.
    assert replans(ev.JobHeld(job_id=1, by="u", epoch=3), applied=True, epoch=3)
    assert replans(ev.RunExited(job_id=1, attempt=0, node="n1", exit_code=0), applied=True, epoch=3)
    assert replans(
        ev.JobSubmitted(job_id=2, user="u", spec=ev.JobSpec(name="j", script="x", workdir="/")), True, 3
    )
