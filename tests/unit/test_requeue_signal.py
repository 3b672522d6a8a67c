"""scontrol requeue[hold] and scancel -s in the pure core: intents, kill and signal orders, conclusions."""

from __future__ import annotations

import pytest
from builders import Log, cluster, exited, job, policy, submitted

from corral.libs.core.fold import fold
from corral.libs.core.orders import orders
from corral.libs.core.plan import plan
from corral.libs.core.state import encode_state
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.gateway import control

pytestmark = pytest.mark.unit

POLICY = policy()


def cycle(log: Log) -> list[ev.Event]:
    """Plan and append the decisions, as the live scheduler does."""
    decisions = plan(log.state, log.state.now, POLICY).decisions
    log.add(*decisions)
    return decisions


def running(nodes: int = 2, requeue: bool = True) -> Log:
    """Job 1 runs attempt 0 on gpu01 (+ gpu02), started."""
    log = Log(*cluster(nodes=4))
    log.add(submitted(1, job(nodes=nodes, requeue=requeue)))
    cycle(log)
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=1))
    return log


def kills(log: Log) -> list[api.KillOrder]:
    """The kill orders the state needs."""
    return [o for o in orders(log.state, POLICY) if isinstance(o, api.KillOrder)]


def signals(log: Log) -> list[tuple[str, int, bool, str]]:
    """(node, signal, scope, request id) of the signal orders the state needs."""
    return [
        (o.node, o.signal, o.scope, o.request_id)
        for o in orders(log.state, POLICY)
        if isinstance(o, api.SignalOrder)
    ]


@pytest.mark.parametrize(("hold", "held"), [(False, ""), (True, "user")], ids=["requeue", "requeuehold"])
def test_a_requested_requeue_kills_the_run_then_requeues_it_with_restart_count_plus_one(
    hold: bool, held: str
) -> None:
    log = running()
    log.add(ev.JobRequeueRequested(job_id=1, user="alice", hold=hold))
    assert log.state.jobs[1].state == "RUNNING"  # not concluded before the run is seen to exit
    assert cycle(log) == []
    assert kills(log) == [
        api.KillOrder(job_id=1, attempt=0, node="gpu01", reason="requeue", cause_id=log.allocation_id(1))
    ]
    log.add(exited(1, "gpu01", signal=15, killed=True))
    assert cycle(log)[0] == ev.JobRequeued(job_id=1, attempt=0, reason="Requested", hold=hold)
    job1 = log.state.jobs[1]
    assert (job1.state, job1.restart_count, job1.held, job1.requeue_by) == ("PENDING", 1, held, None)
    decisions = cycle(log)
    started = [d for d in decisions if isinstance(d, ev.JobAllocated)]
    assert [d.attempt for d in started] == ([] if hold else [1])


def test_a_requested_requeue_on_a_lost_node_is_a_requested_requeue() -> None:
    log = running()
    log.add(ev.JobRequeueRequested(job_id=1, user="alice"))
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    assert cycle(log)[0] == ev.JobRequeued(job_id=1, attempt=0, reason="Requested")


@pytest.mark.parametrize(
    "before",
    [
        ev.JobCancelRequested(job_id=1, user="alice"),
        ev.RunExited(job_id=1, attempt=0, node="gpu01", exit_code=0),
        ev.JobPreempted(job_id=1, attempt=0, mode="cancel", by_job=9),
    ],
    ids=["cancelled", "exited", "preempted"],
)
def test_a_requeue_of_a_run_that_is_ending_changes_nothing(before: ev.Event) -> None:
    log = running()
    log.add(before)
    log.add(ev.JobRequeueRequested(job_id=1, user="alice"))
    assert log.state.jobs[1].requeue_by is None


def test_a_requeue_of_a_pending_job_changes_nothing() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, gpus=16)))  # never fits
    log.add(ev.JobRequeueRequested(job_id=1, user="alice"))
    assert log.state.jobs[1].requeue_by is None
    assert [type(d) for d in cycle(log)] == []


def test_cancel_wins_over_a_requeue_in_progress() -> None:
    log = running()
    log.add(ev.JobRequeueRequested(job_id=1, user="alice"))
    log.add(ev.JobCancelRequested(job_id=1, user="alice"))
    assert [o.reason for o in kills(log)] == ["cancel"]
    log.add(exited(1, "gpu01", signal=15, killed=True))
    assert isinstance(cycle(log)[0], ev.JobCancelled)


def test_requeue_replays_to_the_same_state() -> None:
    log = running()
    log.add(ev.JobRequeueRequested(job_id=1, user="alice", hold=True))
    log.add(exited(1, "gpu01", signal=15, killed=True))
    cycle(log)
    assert encode_state(fold(log.entries)) == encode_state(log.state)


@pytest.mark.parametrize(
    ("scope", "nodes"),
    [("steps", ["gpu01", "gpu02"]), ("full", ["gpu01", "gpu02"]), ("batch", ["gpu01"])],
    ids=["steps", "full", "batch"],
)
def test_a_signal_request_is_one_order_per_node_until_the_run_ends(
    scope: ev.SignalScope, nodes: list[str]
) -> None:
    log = running()
    log.add(ev.JobSignalRequested(job_id=1, user="alice", signal=10, scope=scope, request_id="r1"))
    log.add(ev.JobSignalRequested(job_id=1, user="alice", signal=10, scope=scope, request_id="r1"))
    assert signals(log) == [(n, 10, scope, "r1") for n in nodes]
    assert cycle(log) == []  # a signal ends nothing
    log.add(exited(1, "gpu01", exit_code=0))
    assert signals(log) == []
    cycle(log)
    assert log.state.jobs[1].signals == ()


def test_signal_order_ids_are_distinct_per_request() -> None:
    log = running(nodes=1)
    for rid in ("r1", "r2"):
        log.add(ev.JobSignalRequested(job_id=1, user="alice", signal=12, request_id=rid))
    ids = [api.order_msg_id(o) for o in orders(log.state, POLICY)]
    assert ids == ["1:0:gpu01:signal:r1", "1:0:gpu01:signal:r2"]


def test_a_signal_for_a_pending_job_changes_nothing() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, gpus=16)))
    log.add(ev.JobSignalRequested(job_id=1, user="alice", signal=10, request_id="r1"))
    assert log.state.jobs[1].signals == ()


@pytest.mark.parametrize(
    ("latest", "problem"),
    [
        (ev.JobAllocated(job_id=1, attempt=0, partition="gpu", allocations=[], time_limit_s=None), None),
        (ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=1), None),
        (ev.JobRequeueRequested(job_id=1, user="alice"), None),
        (ev.JobSignalRequested(job_id=1, user="alice", signal=10, request_id="r"), None),
        (ev.RunExited(job_id=1, attempt=0, node="gpu01", exit_code=0), control.ALREADY_DONE),
        (ev.JobCancelRequested(job_id=1, user="alice"), control.ALREADY_DONE),
        (ev.JobCompleted(job_id=1, attempt=0), control.ALREADY_DONE),
        (ev.JobRequeued(job_id=1, attempt=0, reason="Requested"), control.PENDING),
        (ev.JobHeld(job_id=1, by="alice"), control.PENDING),
        (None, control.PENDING),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str | None) else str(v),
)
def test_the_gateway_requeues_and_signals_only_a_live_run(
    latest: ev.Event | None, problem: str | None
) -> None:
    assert control.run_problem(latest) == problem
