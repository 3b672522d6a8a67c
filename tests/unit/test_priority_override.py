"""``scontrol update Priority=``: an admin-set priority overrides the computed one; ``Priority=0`` holds."""

from __future__ import annotations

import dataclasses

import pytest
from builders import Log, cluster, job, policy, submitted

from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import Policy
from corral.libs.core.priority import PriorityWeights, queue_order
from corral.schemas import events as ev
from corral.schemas.codec import decode

pytestmark = pytest.mark.unit

FIFO = policy()
WEIGHTED = dataclasses.replace(policy(), weights=PriorityWeights(age=1000, job_size=500))


def decide(log: Log, pol: Policy = FIFO) -> Plan:
    """One cycle whose decisions are appended to the log."""
    out = plan(log.state, log.state.now, pol)
    for decision in out.decisions:
        log.add(decision, step=0.0)
    return out


def pending_log(count: int = 3) -> Log:
    """A full cluster (one node, busy) and ``count`` pending 8-GPU jobs 1..count, oldest first."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(100, job(gpus=8, nodes=1)))
    decide(log)
    for job_id in range(1, count + 1):
        log.add(submitted(job_id, job(gpus=8, nodes=1)), step=10.0)
    return log


def update(log: Log, job_id: int, pol: Policy = FIFO, **fields: object) -> None:
    """An admin's update request, answered by the scheduler (JobUpdated) and folded."""
    log.add(ev.JobUpdateRequested(job_id=job_id, user="root", admin=True, **fields))  # type: ignore[arg-type]
    decided = decide(log, pol)
    assert any(isinstance(d, ev.JobUpdated) and d.job_id == job_id for d in decided.decisions)


def order(log: Log, pol: Policy) -> list[tuple[int, int]]:
    pending = [j for j in log.state.jobs.values() if j.state == "PENDING"]
    return [(j.job_id, value) for j, value in queue_order(log.state, log.state.now, pol, pending)]


@pytest.mark.parametrize(
    ("pol", "overrides", "wanted"),
    [
        (FIFO, {}, [1, 2, 3]),
        (FIFO, {3: 5}, [3, 1, 2]),
        (FIFO, {1: 1, 3: 2}, [3, 1, 2]),
        (WEIGHTED, {}, [1, 2, 3]),
        (WEIGHTED, {3: 100_000}, [3, 1, 2]),
        (WEIGHTED, {1: 1}, [2, 3, 1]),
    ],
    ids=["fifo", "fifo, raised", "fifo, two set", "weighted", "weighted, raised", "weighted, lowered"],
)
def test_an_admin_set_priority_replaces_the_computed_one_in_queue_order(
    pol: Policy, overrides: dict[int, int], wanted: list[int]
) -> None:
    log = pending_log()
    for job_id, value in overrides.items():
        update(log, job_id, pol, priority=value)
    ranked = order(log, pol)
    assert [job_id for job_id, _ in ranked] == wanted
    for job_id, value in ranked:
        if job_id in overrides:
            assert value == overrides[job_id]


def test_the_override_is_what_the_plan_reports_and_survives_a_time_limit_update() -> None:
    log = pending_log(2)
    update(log, 2, priority=777)
    assert decide(log).priorities == {1: 1, 2: 777}
    update(log, 2, time_limit_s=600)
    job2 = log.state.jobs[2]
    assert (job2.priority_override, job2.spec.time_limit_s) == (777, 600)
    assert decide(log).priorities[2] == 777


def test_the_job_with_the_override_starts_first_when_resources_free() -> None:
    log = pending_log(2)
    update(log, 2, priority=10)
    log.add(ev.RunExited(job_id=100, attempt=0, node="gpu01", exit_code=0))
    decide(log)  # concludes job 100 and starts the highest priority job in the same cycle
    assert (log.state.jobs[1].state, log.state.jobs[2].state) == ("PENDING", "RUNNING")


def test_priority_zero_holds_the_job_as_an_admin_hold_and_release_restores_the_computed_priority() -> None:
    log = pending_log(2)
    update(log, 1, priority=50)
    update(log, 1, priority=0)
    job1 = log.state.jobs[1]
    assert (job1.held, job1.priority_override) == ("admin", None)
    out = decide(log)
    assert out.priorities[1] == 0
    log.add(ev.JobReleaseRequested(job_id=1, user="root", admin=True))
    decide(log)
    assert (job1.held, job1.priority_override) == ("", None)
    assert decide(log).priorities[1] == 1


def test_an_old_job_updated_without_priority_decodes_and_keeps_the_computed_priority() -> None:
    old = b'{"type":"job_updated","job_id":1,"by":"alice","time_limit_s":60,"partition":"gpu"}'
    body = decode(old, ev.Event)  # type: ignore[arg-type]
    assert isinstance(body, ev.JobUpdated) and body.priority is None
