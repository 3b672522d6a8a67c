"""Advance reservations: the scheduler's choice of nodes, the hold they are for outsiders, their members."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from builders import Log, allocated, cluster, job, policy, submitted

from corral.libs.core.fold import fold
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import Policy
from corral.libs.core.state import decode_state, encode_state
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

EASY = policy()
CONSERVATIVE = dataclasses.replace(EASY, backfill="conservative")
FIFO = dataclasses.replace(EASY, backfill="fifo")
POLICIES = pytest.mark.parametrize("pol", [EASY, CONSERVATIVE, FIFO], ids=["easy", "conservative", "fifo"])


def run(log: Log, pol: Policy = EASY, at: float | None = None) -> Plan:
    """Plan at ``at`` (the log's clock by default) and fold the decisions back."""
    out = plan(log.state, log.state.now if at is None else at, pol)
    log.add(*out.decisions, step=0.0)
    return out


def started(out: Plan) -> dict[int, list[str]]:
    return {
        d.job_id: [a.node for a in d.allocations] for d in out.decisions if isinstance(d, ev.JobAllocated)
    }


def request(log: Log, name: str = "R", start: float = 0.0, end: float = 1000.0, **fields: Any) -> None:
    """Append a create request; ``start``/``end`` are offsets from the log's clock."""
    now = log.state.now
    fields.setdefault("users", ["alice"])
    log.add(
        ev.ReservationCreateRequested(
            name=name, user="root", start_time=now + start, end_time=now + end, **fields
        ),
        step=0.0,
    )


def answer(log: Log, pol: Policy = EASY) -> ev.Event:
    out = run(log, pol)
    decisions = [d for d in out.decisions if isinstance(d, ev.RESERVATION_EVENTS)]
    assert len(decisions) == 1, out.decisions
    return decisions[0]


def two_nodes(busy_gpus: int = 0, busy_s: int | None = 100) -> Log:
    """gpu01 and gpu02 (8 GPUs each); job 1 holds ``busy_gpus`` GPUs of gpu01 for ``busy_s`` seconds."""
    log = Log(*cluster(nodes=2, gpus=8))
    if busy_gpus:
        log.add(submitted(1, job(gpus=busy_gpus, nodes=1, time_s=busy_s)))
        log.add(allocated(1, {"gpu01": list(range(busy_gpus))}, time_s=busy_s))
    return log


@pytest.mark.parametrize(
    ("busy", "fields", "expected"),
    [
        (0, {"nodes": ["gpu02"]}, (["gpu02"], [])),
        (8, {"node_count": 1}, (["gpu02"], [])),  # the idle node
        (8, {"node_count": 2}, "Requested nodes are busy"),  # job 1 still runs at the start
        (8, {"node_count": 2, "start": 200.0}, (["gpu01", "gpu02"], [])),  # job 1 ended by then
        (8, {"node_count": 2, "flags": ["IGNORE_JOBS"]}, (["gpu01", "gpu02"], [])),
        (8, {"nodes": ["gpu01"]}, "Requested nodes are busy"),
        (6, {"gpu_count": 4}, (["gpu02"], [4])),  # idle nodes first
        (6, {"gpu_count": 10}, (["gpu01", "gpu02"], [2, 8])),  # the other 2 GPUs of gpu01
        (6, {"gpu_count": 11}, "Requested nodes are busy"),
        (0, {"nodes": ["gpu09"]}, "Invalid node name specified"),
        (0, {"node_count": 1, "partition": "cpu"}, "Invalid partition name specified"),
        (0, {"node_count": 1, "start": 100.0, "end": 50.0}, "Invalid time specification"),
    ],
)
def test_the_scheduler_chooses_the_nodes_or_says_why_not(
    busy: int, fields: dict[str, Any], expected: tuple[list[str], list[int]] | str
) -> None:
    log = two_nodes(busy)
    request(log, start=fields.pop("start", 0.0), end=fields.pop("end", 1000.0), **fields)
    decision = answer(log)
    if isinstance(expected, str):
        assert decision == ev.ReservationRejected(name="R", reason=expected)
        assert "R" not in log.state.reservations and not log.state.resv_requests
    else:
        assert isinstance(decision, ev.ReservationCreated)
        assert (decision.nodes, decision.gpus) == expected
        assert log.state.reservations["R"] == decision and not log.state.resv_requests


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        ({"nodes": ["gpu02"]}, {"nodes": ["gpu02"]}, "Requested nodes are busy"),
        ({"nodes": ["gpu02"]}, {"nodes": ["gpu02"], "flags": ["MAINT"]}, None),  # MAINT may overlap
        ({"nodes": ["gpu02"]}, {"nodes": ["gpu02"], "start": 1000.0, "end": 2000.0}, None),  # after it
        ({"nodes": ["gpu02"]}, {"node_count": 1}, None),  # gpu01 is free
        ({"gpu_count": 4}, {"gpu_count": 12}, None),  # 4 + 8 of 16
        ({"gpu_count": 4}, {"gpu_count": 13}, "Requested nodes are busy"),
    ],
)
def test_reservations_do_not_overlap_unless_maint(
    first: dict[str, Any], second: dict[str, Any], expected: str | None
) -> None:
    log = two_nodes()
    request(log, "A", **first)
    assert isinstance(answer(log), ev.ReservationCreated)
    request(log, "B", start=second.pop("start", 0.0), end=second.pop("end", 1000.0), **second)
    decision = answer(log)
    if expected is None:
        assert isinstance(decision, ev.ReservationCreated)
    else:
        assert decision == ev.ReservationRejected(name="B", reason=expected)


def test_a_name_is_held_once_and_delete_needs_a_live_reservation() -> None:
    log = two_nodes()
    request(log, nodes=["gpu01"])
    answer(log)
    request(log, nodes=["gpu02"])
    assert answer(log) == ev.ReservationRejected(name="R", reason="Duplicate reservation name")
    log.add(ev.ReservationDeleteRequested(name="R", user="root"), step=0.0)
    assert answer(log) == ev.ReservationDeleted(name="R", by="root")
    log.add(ev.ReservationDeleteRequested(name="R", user="root"), step=0.0)
    assert answer(log) == ev.ReservationRejected(
        name="R", reason="Requested reservation is invalid", delete=True
    )
    assert not log.state.reservations and not log.state.resv_requests


@POLICIES
@pytest.mark.parametrize(
    ("limit", "runs_on"),
    [
        (50, ["gpu02"]),  # ends before the reservation starts: backfills there
        (100, ["gpu02"]),  # ends exactly at its start
        (101, None),  # would still run at its start
        (500, None),
        (None, None),  # unlimited: runs forever
    ],
)
def test_an_outsider_never_runs_into_a_future_reservation(
    pol: Policy, limit: int | None, runs_on: list[str] | None
) -> None:
    log = two_nodes(8, busy_s=10_000)  # gpu01 busy for long
    request(log, nodes=["gpu02"], start=100.0, end=1000.0)
    answer(log, pol)
    log.add(submitted(2, job(gpus=1, nodes=1, time_s=limit)), step=0.0)
    out = run(log, pol)
    assert started(out) == ({2: runs_on} if runs_on else {})


@POLICIES
def test_a_blocked_outsider_is_planned_after_the_reservation(pol: Policy) -> None:
    log = two_nodes(8, busy_s=10_000)
    request(log, nodes=["gpu02"], start=0.0, end=1000.0)
    answer(log, pol)
    log.add(submitted(2, job(gpus=8, nodes=1, time_s=100)), step=0.0)
    now = log.state.now
    out = run(log, pol)
    assert started(out) == {}
    if pol.backfill != "fifo":
        assert out.starts[2] == now + 1000  # not within the reservation's window
    assert out.reasons[2] == "Resources"


@pytest.mark.parametrize(
    ("user", "spec", "at", "expected"),
    [
        ("alice", {"time_s": 100}, 0.0, ["gpu02"]),  # a member, inside the window: on its node
        ("alice", {"time_s": 2000}, 0.0, "Reservation"),  # its limit ends after the reservation
        ("alice", {"time_s": None}, 0.0, "Reservation"),  # unlimited
        ("alice", {"time_s": 100}, -500.0, "Reservation"),  # the window has not begun
        ("bob", {"time_s": 100}, 0.0, "Reservation"),  # not in Users= nor Accounts=
        ("bob", {"time_s": 100, "account": "physics"}, 0.0, ["gpu02"]),  # in Accounts=
        ("alice", {"time_s": 100, "reservation": "other"}, 0.0, "ReservationDeleted"),  # no such one
    ],
)
def test_a_member_job_runs_only_inside_its_reservation(
    user: str, spec: dict[str, Any], at: float, expected: list[str] | str
) -> None:
    log = two_nodes()
    request(log, nodes=["gpu02"], start=0.0, end=1000.0, users=["alice"], accounts=["physics"])
    answer(log)
    spec.setdefault("reservation", "R")
    log.add(submitted(2, job(gpus=8, nodes=1, **spec), user=user), step=0.0)
    out = run(log, at=log.state.now + at)
    if isinstance(expected, list):
        assert started(out) == {2: expected}
    else:
        assert started(out) == {} and out.reasons[2] == expected


def test_a_member_waiting_for_the_start_wakes_the_scheduler_then() -> None:
    log = two_nodes()
    request(log, nodes=["gpu02"], start=300.0, end=1000.0)
    answer(log)
    start = log.state.reservations["R"].start_time
    log.add(submitted(2, job(gpus=8, nodes=1, time_s=100, reservation="R")), step=0.0)
    out = run(log)
    assert out.reasons[2] == "Reservation" and out.wake_at == start
    assert started(run(log, at=start)) == {2: ["gpu02"]}


def test_a_pending_member_does_not_block_the_partition() -> None:
    log = two_nodes()
    request(log, nodes=["gpu02"], start=0.0, end=1000.0)
    answer(log)
    log.add(
        submitted(2, job(gpus=8, nodes=1, time_s=5000, reservation="R")),  # too long: waits
        submitted(3, job(gpus=8, nodes=1, time_s=5000)),  # an outsider: gpu01
        step=0.0,
    )
    out = run(log, FIFO)
    assert started(out) == {3: ["gpu01"]} and out.reasons[2] == "Reservation"


def test_a_gpu_count_reservation_leaves_the_other_gpus_usable() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    request(log, gpu_count=4)
    answer(log)
    log.add(
        submitted(1, job(gpus=4, nodes=1, time_s=100)),  # outsider: the 4 unreserved GPUs
        submitted(2, job(gpus=2, nodes=1, time_s=100)),  # outsider: nothing left outside
        submitted(3, job(gpus=3, nodes=1, time_s=100, reservation="R")),  # member: 3 of its 4
        submitted(4, job(gpus=2, nodes=1, time_s=100, reservation="R")),  # member: only 1 left
        submitted(5, job(gpus=1, nodes=1, time_s=100, reservation="R")),  # member: the last one
        step=0.0,
    )
    out = run(log)
    assert started(out) == {1: ["gpu01"], 3: ["gpu01"], 5: ["gpu01"]}
    assert out.reasons[2] == "Resources" and out.reasons[4] == "Resources"
    # The next cycle sees the same: the members' GPUs are the reservation's, not the outsiders'.
    again = run(log)
    assert started(again) == {} and again.reasons[2] == "Resources"


def test_deleting_a_reservation_frees_its_nodes() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    request(log, nodes=["gpu01"], start=0.0, end=1000.0, flags=["MAINT"])
    answer(log)
    log.add(submitted(1, job(gpus=1, nodes=1, time_s=100)), step=0.0)
    out = run(log)
    assert started(out) == {} and out.reason_text(1) == "ReqNodeNotAvail, Reserved for maintenance"
    log.add(ev.ReservationDeleteRequested(name="R", user="root"), step=0.0)
    out = run(log)
    assert ev.ReservationDeleted(name="R", by="root") in out.decisions
    assert not log.state.reservations
    assert started(run(log)) == {1: ["gpu01"]}


def test_a_reservation_is_over_at_its_end() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    request(log, nodes=["gpu01"], start=0.0, end=100.0)
    answer(log)
    end = log.state.reservations["R"].end_time
    log.add(submitted(1, job(gpus=1, nodes=1, time_s=10)), step=0.0)
    assert started(run(log)) == {}
    assert started(run(log, at=end)) == {1: ["gpu01"]}  # the planner's clock reached the end
    log.add(submitted(2, job(gpus=1, nodes=1, time_s=10)), step=200.0)
    assert "R" not in log.state.reservations  # the log's clock passed the end: the fold forgot it


def test_replaying_the_log_gives_identical_state_bytes() -> None:
    log = two_nodes(6)
    request(log, "A", gpu_count=4, start=10.0)
    request(log, "B", nodes=["gpu01"], flags=["MAINT"])
    request(log, "C", node_count=5)
    run(log)
    log.add(submitted(2, job(gpus=2, nodes=1, time_s=100, reservation="A")), step=20.0)
    run(log)
    log.add(ev.ReservationDeleteRequested(name="B", user="root"))
    run(log)
    state = encode_state(log.state)
    assert encode_state(fold(log.entries)) == state
    assert encode_state(decode_state(state)) == state
    assert sorted(log.state.reservations) == ["A"]
    assert log.state.resv_seqs["C"] > 0
