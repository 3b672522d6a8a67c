"""Each decision names its cause (``libs/core/causation.py``): the entry whose event id is its causation id,
case by case; every decision of random histories names one is checked in ``test_plan.py``."""

from __future__ import annotations

import pytest
from builders import Log, cluster, exited, job, policy, submitted
from test_preempt import POLICY as PREEMPTING
from test_preempt import new_log, run

from corral.libs.core.orders import orders
from corral.libs.core.plan import plan
from corral.libs.core.policy import Policy
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev

pytestmark = pytest.mark.unit
POLICY = policy()


def cycle(log: Log, pol: Policy = POLICY) -> None:
    """One cycle, its decisions appended with their causes (as the scheduler does)."""
    log.decide(plan(log.state, log.state.now, pol).decisions)


def cause(log: Log, kind: type[ev.Event], job_id: int | None = None) -> ev.Event:
    """The body of the entry the newest ``kind`` (of ``job_id``) names as its cause."""
    by_id = {e.meta.event_id: e.body for _, e in log.entries}
    decision = next(
        e
        for _, e in reversed(log.entries)
        if isinstance(e.body, kind) and job_id in (None, getattr(e.body, "job_id", None))
    )
    assert decision.meta.causation_id is not None, f"{decision.body!r} has no cause"
    return by_id[decision.meta.causation_id]


def started(nodes: int = 1, **spec: object) -> Log:
    """Job 1 runs on a 2-node cluster, its script started."""
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=nodes, **spec)))  # type: ignore[arg-type]
    cycle(log)
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=1))
    return log


def test_an_allocation_is_caused_by_the_submission_then_by_the_requeue_after_a_node_went_down() -> None:
    log = started(nodes=2)
    assert cause(log, ev.JobAllocated) == submitted(1, job(nodes=2))
    down = ev.NodeDown(node="gpu02", reason="Not responding")
    log.add(down)
    cycle(log)  # requeued
    assert cause(log, ev.JobRequeued) == down
    log.add(exited(1, "gpu01", signal=15, killed=True), exited(1, "gpu02", signal=15, killed=True))
    log.add(ev.NodeUp(node="gpu02"))
    cycle(log)
    assert isinstance(cause(log, ev.JobAllocated), ev.JobRequeued)


@pytest.mark.parametrize(
    ("how", "decision"),
    [({}, ev.JobCompleted), ({"exit_code": 3}, ev.JobFailed),
     ({"timed_out": True, "signal": 15}, ev.JobFailed)],
    ids=["completed", "failed", "time-limit"],
)  # fmt: skip
def test_a_conclusion_of_an_exit_is_caused_by_the_batch_nodes_exit(
    how: dict[str, object], decision: type[ev.Event]
) -> None:
    log = started()
    log.add(exited(1, "gpu01", **how))
    cycle(log)
    assert cause(log, decision) == exited(1, "gpu01", **how)


def test_a_cancel_of_a_running_job_and_a_requeue_on_request_are_caused_by_the_request() -> None:
    log = started(requeue=True)
    log.add(ev.JobRequeueRequested(job_id=1, user="alice"))
    log.add(exited(1, "gpu01", signal=15, killed=True))
    cycle(log)
    assert cause(log, ev.JobRequeued) == ev.JobRequeueRequested(job_id=1, user="alice")
    cycle(log)
    log.add(ev.RunStarted(job_id=1, attempt=1, node="gpu01", pid=2))
    log.add(ev.JobCancelRequested(job_id=1, user="root"))
    log.add(exited(1, "gpu01", attempt=1, signal=15, killed=True))
    cycle(log)
    assert cause(log, ev.JobCancelled) == ev.JobCancelRequested(job_id=1, user="root")


def test_every_task_of_a_cancelled_array_is_cancelled_by_the_one_request() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, array=parse_array("0-2"), held=True)))
    request = ev.JobCancelRequested(job_id=1, user="alice", whole_array=True)
    log.add(request)
    cycle(log)
    assert [cause(log, ev.JobCancelled, task) for task in (1, 2, 3)] == [request] * 3


def test_hold_and_release_are_caused_by_their_requests_and_the_start_by_the_release() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, held=True)))
    log.add(ev.JobReleaseRequested(job_id=1, user="alice"))
    cycle(log)
    assert cause(log, ev.JobReleased) == ev.JobReleaseRequested(job_id=1, user="alice")
    cycle(log)
    assert cause(log, ev.JobAllocated) == ev.JobReleased(job_id=1, by="alice")


def test_a_preemption_is_caused_by_the_preemptors_submission_and_the_victims_requeue_by_it() -> None:
    log = new_log()
    run(log, 1, "low", {"gpu01": list(range(8))})
    preemptor = submitted(2, job(gpus=8, nodes=1, partition="high"))
    log.add(preemptor)
    cycle(log, PREEMPTING)
    assert cause(log, ev.JobPreempted) == preemptor
    log.add(exited(1, "gpu01", signal=15, killed=True))
    cycle(log, PREEMPTING)
    assert isinstance(cause(log, ev.JobRequeued, 1), ev.JobPreempted)


def test_the_launch_and_kill_orders_name_the_runs_allocation() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1)))
    cycle(log)
    (launch,) = orders(log.state, POLICY)
    assert isinstance(launch, api.LaunchOrder) and launch.cause_id == log.allocation_id(1)
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=1))
    log.add(ev.JobCancelRequested(job_id=1, user="alice"))
    (kill,) = orders(log.state, POLICY)
    assert isinstance(kill, api.KillOrder) and kill.cause_id == log.allocation_id(1)


def test_a_reservations_answer_is_caused_by_its_request() -> None:
    log = Log(*cluster(nodes=2))
    at = log.state.now
    request = ev.ReservationCreateRequested(
        name="maint", user="root", start_time=at, end_time=at + 3600, node_count=1
    )
    log.add(request)
    cycle(log)
    assert cause(log, ev.ReservationCreated) == request
    assert log.state.resv_causes == {}  # answered: nothing kept
