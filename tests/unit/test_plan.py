"""The scheduling cycle: FIFO placement, conclusions of runs, time limits, and per-node orders."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import pytest
from builders import (
    Log,
    allocated,
    cluster,
    exited,
    job,
    partition,
    policy,
    registered,
    submitted,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.libs.core.fold import fold
from corral.libs.core.orders import orders
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import Policy
from corral.libs.core.state import State, encode_state
from corral.schemas import api, codec
from corral.schemas import events as ev
from corral.schemas.events import NodeAllocation

pytestmark = pytest.mark.unit

T = TypeVar("T")
POLICY = policy()
FIFO = dataclasses.replace(POLICY, backfill="fifo")
EIGHT = list(range(8))


def cycle(log: Log, pol: Policy = POLICY, epoch: int = 0) -> Plan:
    """Plan on the log's state and append the decisions, as the live scheduler does."""
    out = plan(log.state, log.state.now, pol, epoch)
    log.decide(out.decisions)
    return out


def allocations(out: Plan) -> dict[int, list[ev.NodeAllocation]]:
    """Job id -> allocation of every JobAllocated in a plan."""
    return {d.job_id: d.allocations for d in out.decisions if isinstance(d, ev.JobAllocated)}


def test_fifo_by_submit_time_then_id() -> None:
    log = Log(*cluster(nodes=1))
    # Job 3 was submitted first; 1 and 2 share a submit time, so the lower id goes first.
    log.add(submitted(3, job(gpus=4, nodes=1)))
    log.add(submitted(2, job(gpus=4, nodes=1)))
    log.add(submitted(1, job(gpus=4, nodes=1)), step=0)
    assert log.state.jobs[1].submit_time == log.state.jobs[2].submit_time > log.state.jobs[3].submit_time
    out = cycle(log)
    assert list(allocations(out)) == [3, 1]
    assert allocations(out)[3][0].gpus == [0, 1, 2, 3]
    assert allocations(out)[1][0].gpus == [4, 5, 6, 7]
    assert out.reasons == {2: "Resources"}


def test_the_first_job_that_does_not_fit_blocks_its_partition_only() -> None:
    log = Log(*cluster(nodes=2))
    log.add(registered("cpu01", gpus=0, gpu_type=None, partitions=("cpu",)))
    log.add(
        submitted(1, job(gpus=8, nodes=3)),  # never fits now: 2 nodes
        submitted(2, job(gpus=1, nodes=1)),  # would fit, but must wait behind job 1
        submitted(3, job(gpus=0, nodes=1, partition="cpu")),  # another partition
        submitted(4, job(gpus=1, nodes=1)),
    )
    out = cycle(log, FIFO)
    assert list(allocations(out)) == [3]
    assert out.reasons == {1: "Resources", 2: "Priority", 4: "Priority"}
    assert log.state.jobs[3].state == "RUNNING"


def test_easy_backfills_around_a_job_that_can_never_be_planned() -> None:
    """With EASY, a blocked job with no possible reservation does not hold up jobs that fit now."""
    log = Log(*cluster(nodes=2))
    log.add(
        submitted(1, job(gpus=8, nodes=3)),  # needs 3 nodes of 2: no reservation possible
        submitted(2, job(gpus=1, nodes=1)),
        submitted(4, job(gpus=1, nodes=1)),
    )
    out = cycle(log)
    assert list(allocations(out)) == [2, 4]
    assert out.reasons == {1: "Resources"}
    assert out.starts == {}


def test_a_multi_node_job_gets_distinct_whole_nodes() -> None:
    log = Log(*cluster(nodes=16))
    log.add(submitted(1, job(gpus=8, nodes=4)))
    out = cycle(log)
    (alloc,) = allocations(out).values()
    assert [a.node for a in alloc] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert all(a.gpus == EIGHT and a.cpus == 1 for a in alloc)
    assert log.state.jobs[1].state == "RUNNING"


def test_jobs_of_one_cycle_never_share_a_gpu() -> None:
    log = Log(*cluster(nodes=2))
    log.add(*(submitted(i, job(gpus=3, nodes=2)) for i in range(1, 4)))
    out = cycle(log)
    assert list(allocations(out)) == [1, 2]
    held = [(a.node, g) for alloc in allocations(out).values() for a in alloc for g in a.gpus]
    assert len(held) == len(set(held)) == 12
    assert out.reasons == {3: "Resources"}


def test_a_cycle_with_nothing_to_do_decides_nothing() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(gpus=8, nodes=2)))
    cycle(log)
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=1))
    assert plan(log.state, log.state.now, POLICY) == Plan(at=log.state.now)


def running(requeue: bool = True, nodes: int = 2) -> Log:
    """Job 1 (``nodes`` nodes, 8 GPUs each) runs attempt 0 on a 4-node cluster, started."""
    log = Log(*cluster(nodes=4))
    log.add(submitted(1, job(nodes=nodes, requeue=requeue)))
    cycle(log)
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=1))
    return log


@pytest.mark.parametrize(
    ("requeue", "decision", "final"),
    [
        (True, ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"), "PENDING"),
        (False, ev.JobFailed(job_id=1, attempt=0, reason="NodeFail"), "NODE_FAIL"),
    ],
    ids=["requeue", "no-requeue"],
)
def test_a_running_job_with_a_down_node(requeue: bool, decision: ev.Event, final: str) -> None:
    log = running(requeue=requeue)
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    out = plan(log.state, log.state.now, POLICY)
    assert out.decisions[0] == decision
    log.add(*out.decisions)
    assert log.state.jobs[1].state == final
    # Every node of the run is told to kill what it runs of it: the batch node's script, and the down
    # node's tasks (its order waits in its work queue for its agent, which may have died alone).
    assert orders(log.state, POLICY) == [
        api.KillOrder(job_id=1, attempt=0, node="gpu01", reason="requeue", cause_id=log.allocation_id(1)),
        api.KillOrder(job_id=1, attempt=0, node="gpu02", reason="requeue", cause_id=log.allocation_id(1)),
    ]


def test_a_requeued_job_is_placed_again_with_the_next_attempt() -> None:
    log = running()
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    cycle(log)  # requeue
    out = cycle(log)
    (decision,) = out.decisions
    assert isinstance(decision, ev.JobAllocated)
    assert decision.attempt == 1
    assert "gpu02" not in [a.node for a in decision.allocations]  # down
    assert log.state.jobs[1].restart_count == 1


def test_a_cancelled_job_that_loses_a_node_is_not_requeued() -> None:
    log = running()
    log.add(ev.JobCancelRequested(job_id=1, user="alice"), ev.NodeDown(node="gpu01", reason="x"))
    assert plan(log.state, log.state.now, POLICY).decisions == [
        ev.JobFailed(job_id=1, attempt=0, reason="NodeFail")
    ]


EXITS = [
    (exited(1, "gpu01"), None, True, ev.JobCompleted(job_id=1, attempt=0), "exit 0"),
    (
        exited(1, "gpu01", exit_code=3),
        None,
        True,
        ev.JobFailed(job_id=1, attempt=0, reason="NonZeroExitCode", exit_code=3),
        "exit 3",
    ),
    (
        exited(1, "gpu01", signal=11),
        None,
        True,
        ev.JobFailed(job_id=1, attempt=0, reason="RaisedSignal", signal=11),
        "signal",
    ),
    (
        exited(1, "gpu01", signal=15, timed_out=True),
        None,
        True,
        ev.JobFailed(job_id=1, attempt=0, reason="TimeLimit", signal=15),
        "timed out",
    ),
    (
        exited(1, "gpu01", signal=9, oom=True),
        None,
        True,
        ev.JobFailed(job_id=1, attempt=0, reason="OutOfMemory", signal=125),
        "oom",
    ),
    (
        exited(1, "gpu01", exit_code=1, launch_error="workdir /x: no such directory"),
        None,
        True,
        ev.JobFailed(
            job_id=1, attempt=0, reason="LaunchFailed", exit_code=1, message="workdir /x: no such directory"
        ),
        "launch failed",
    ),
    (
        exited(1, "gpu01", signal=15, killed=True),
        "bob",
        True,
        ev.JobCancelled(job_id=1, attempt=0, by="bob", signal=15),
        "cancelled",
    ),
    (
        exited(1, "gpu01", exit_code=0, killed=True),
        "bob",
        True,
        ev.JobCancelled(job_id=1, attempt=0, by="bob", signal=15),
        "cancelled, exit without signal",
    ),
    (
        exited(1, "gpu01", signal=9, killed=True),
        None,
        True,
        ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"),
        "killed without cancel, requeue",
    ),
    (
        exited(1, "gpu01", signal=9, killed=True),
        None,
        False,
        ev.JobFailed(job_id=1, attempt=0, reason="NodeFail", signal=9),
        "killed without cancel, no-requeue",
    ),
]


@pytest.mark.parametrize(
    ("fact", "cancel_by", "requeue", "decision"), [c[:4] for c in EXITS], ids=[c[4] for c in EXITS]
)
def test_conclusion_of_a_run_exit(
    fact: ev.RunExited, cancel_by: str | None, requeue: bool, decision: ev.Event
) -> None:
    log = running(requeue=requeue)
    if cancel_by is not None:
        log.add(ev.JobCancelRequested(job_id=1, user=cancel_by))
    log.add(fact)
    assert plan(log.state, log.state.now, POLICY).decisions == [decision]


def test_a_conclusion_and_the_placement_it_frees_come_in_one_cycle_in_that_order() -> None:
    # The exited run's resources are free for placement in the cycle that concludes it; the
    # conclusion is appended first, so the fold has released them when it meets the allocation.
    # (Every node's agent reported the run's processes gone, as when its script ended with its steps.)
    log = running(nodes=4)
    log.add(submitted(2, job(nodes=4)), *(exited(1, f"gpu0{i}") for i in (2, 3, 4)), exited(1, "gpu01"))
    first = cycle(log)
    assert first.decisions[0] == ev.JobCompleted(job_id=1, attempt=0)
    assert list(allocations(first)) == [2]
    assert log.state.jobs[1].state == "COMPLETED" and log.state.jobs[2].state == "RUNNING"


def test_a_peer_that_has_not_reported_the_run_gone_is_not_placed_on() -> None:
    log = running(nodes=4)
    log.add(submitted(2, job(nodes=4)), *(exited(1, f"gpu0{i}") for i in (2, 3)), exited(1, "gpu01"))
    first = cycle(log)
    assert first.decisions == [ev.JobCompleted(job_id=1, attempt=0)]  # gpu04 may still run its tasks
    assert [o.node for o in log.state.orphans] == ["gpu04"]
    log.add(exited(1, "gpu04", signal=15, killed=True))
    assert list(allocations(cycle(log))) == [2]


def test_an_allocation_whose_conclusion_was_lost_changes_nothing() -> None:
    """If the conclusion is not appended (a concurrent event won), the fold refuses the allocation."""
    log = running(nodes=4)
    log.add(submitted(2, job(nodes=4)), exited(1, "gpu01"))
    decided = plan(log.state, log.state.now, POLICY)
    log.add(*[d for d in decided.decisions if isinstance(d, ev.JobAllocated)])
    assert log.state.jobs[2].state == "PENDING" and log.state.jobs[1].state == "RUNNING"


def test_a_pending_cancel_is_concluded_without_placing() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1)), ev.JobCancelRequested(job_id=1, user="alice"))
    out = cycle(log)
    assert out.decisions == [ev.JobCancelled(job_id=1, attempt=-1, by="alice", signal=0)]
    assert out.reasons == {}
    assert log.state.jobs[1].state == "CANCELLED"


TIME_LIMITS = [
    (600, 7200, 3600, 600, "from the spec"),
    (None, 7200, 3600, 3600, "partition default"),
    (None, 7200, None, 7200, "partition max without default"),
    (None, None, None, None, "unlimited"),
]


@pytest.mark.parametrize(
    ("spec_s", "max_s", "default_s", "expected"),
    [c[:4] for c in TIME_LIMITS],
    ids=[c[4] for c in TIME_LIMITS],
)
def test_time_limit(
    spec_s: int | None, max_s: int | None, default_s: int | None, expected: int | None
) -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, time_s=spec_s)))
    out = cycle(log, policy(partition(max_s=max_s, default_s=default_s)), epoch=5)
    (decision,) = out.decisions
    assert isinstance(decision, ev.JobAllocated)
    assert (decision.time_limit_s, decision.epoch) == (expected, 5)
    assert log.state.jobs[1].time_limit_s == expected


def test_jobs_without_a_partition_go_to_the_default_one() -> None:
    log = Log(*cluster(nodes=1, partitions=("debug",)), *cluster(nodes=1, partitions=("gpu",), prefix="big"))
    log.add(submitted(1, job(nodes=1)))
    pol = policy(
        partition("gpu", default=False, default_s=60), partition("debug", default=True, default_s=30)
    )
    (decision,) = cycle(log, pol).decisions
    assert isinstance(decision, ev.JobAllocated)
    assert (decision.partition, decision.allocations[0].node, decision.time_limit_s) == ("debug", "gpu01", 30)


# --- orders ------------------------------------------------------------------------------------------


def launch_of(state: State) -> list[int]:
    """Job ids with a launch order."""
    return [o.job_id for o in orders(state, POLICY) if isinstance(o, api.LaunchOrder)]


def test_launch_order_only_for_a_running_job_whose_run_has_not_started() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=2)), submitted(2, job(nodes=1)))
    assert orders(log.state, POLICY) == []  # pending jobs have no work on nodes
    cycle(log)
    (launch,) = orders(log.state, POLICY)
    assert isinstance(launch, api.LaunchOrder)
    assert (launch.job_id, launch.attempt, launch.node, launch.user, launch.cluster) == (
        1,
        0,
        "gpu01",
        "alice",
        "test",
    )
    assert launch.allocations == log.state.jobs[1].allocations
    assert (launch.time_limit_s, launch.account, launch.partition) == (None, "alice", "gpu")
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=7))
    assert orders(log.state, POLICY) == []
    log.add(exited(1, "gpu01"))
    assert orders(log.state, POLICY) == []


def test_launch_order_again_until_the_run_started() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1)))
    cycle(log)
    # Orders are derived from state: after a restart the same launch is republished.
    assert launch_of(log.state) == launch_of(log.state) == [1]


def test_kill_order_for_a_cancelled_running_job() -> None:
    log = running()
    log.add(ev.JobCancelRequested(job_id=1, user="bob"))
    assert orders(log.state, POLICY) == [
        api.KillOrder(job_id=1, attempt=0, node="gpu01", reason="cancel", cause_id=log.allocation_id(1))
    ]
    log.add(exited(1, "gpu01", signal=15, killed=True))
    assert orders(log.state, POLICY) == []


def test_kill_order_for_an_orphan_until_it_exits() -> None:
    log = running()
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    cycle(log)  # requeue: the script on gpu01 is an orphan
    cycle(log)  # attempt 1
    kills = [o for o in orders(log.state, POLICY) if isinstance(o, api.KillOrder)]
    assert kills == [
        api.KillOrder(job_id=1, attempt=0, node="gpu01", reason="requeue", cause_id=log.allocation_id(1)),
        api.KillOrder(job_id=1, attempt=0, node="gpu02", reason="requeue", cause_id=log.allocation_id(1)),
    ]
    assert launch_of(log.state) == [1]
    log.add(exited(1, "gpu01", attempt=0, signal=15, killed=True))
    assert [(type(o), o.node) for o in orders(log.state, POLICY)] == [
        (api.LaunchOrder, "gpu03"),
        (api.KillOrder, "gpu02"),
    ]
    log.add(exited(1, "gpu02", attempt=0, signal=15, killed=True))
    assert [type(o) for o in orders(log.state, POLICY)] == [api.LaunchOrder]


def test_no_placement_on_a_node_whose_orphan_is_still_being_killed() -> None:
    log = running()
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    cycle(log)  # requeue: the script on gpu01 is an orphan
    (decision,) = cycle(log).decisions
    assert isinstance(decision, ev.JobAllocated)
    assert "gpu01" not in [a.node for a in decision.allocations]


def test_a_live_allocation_decision_is_what_the_fold_accepts() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(gpus=2, nodes=1)))
    out = plan(log.state, log.state.now, POLICY, epoch=1)
    assert out.decisions == [allocated(1, {"gpu01": [0, 1]}, time_s=None, epoch=1)]


# --- properties --------------------------------------------------------------------------------------

PROPERTY_POLICY = policy(partition("gpu"), partition("debug", default=False))
NAMES = ["gpu01", "gpu02", "gpu03", "gpu04"]
EXIT_KINDS: dict[str, dict[str, object]] = {
    "ok": {},
    "exit 1": {"exit_code": 1},
    "signal": {"signal": 9},
    "oom": {"signal": 9, "oom": True},
    "timeout": {"signal": 15, "timed_out": True},
    "killed": {"signal": 9, "killed": True},
    "launch error": {"exit_code": 1, "launch_error": "no such directory"},
}

inventories = st.lists(st.tuples(st.integers(1, 8), st.integers(4, 32)), min_size=4, max_size=4)
submit = st.tuples(
    st.just("submit"),
    st.integers(0, 4),  # GPUs per node
    st.integers(1, 3),  # nodes
    st.integers(1, 4),  # CPUs per task
    st.sampled_from([None, "debug"]),
    st.booleans(),  # requeue
)
stale = st.sampled_from([False, False, False, True])  # a late report for the previous attempt
exit_ = st.tuples(st.just("exit"), st.integers(0, 20), st.sampled_from(sorted(EXIT_KINDS)), stale)
actions = st.one_of(
    submit,
    submit,
    submit,
    exit_,
    exit_,
    exit_,
    st.tuples(st.just("start"), st.integers(0, 20)),
    st.tuples(st.just("orphan exit"), st.integers(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
    st.tuples(st.just("down"), st.integers(0, 3)),
    st.tuples(st.just("up"), st.integers(0, 3)),
    st.tuples(st.just("register"), st.integers(0, 3)),
)
History = tuple[list[tuple[int, int]], int, list[tuple[tuple[object, ...], bool]]]
#: A history: node inventories, how many register at first, and actions, each maybe followed by a cycle.
histories = st.tuples(
    inventories, st.integers(1, 4), st.lists(st.tuples(actions, st.booleans()), min_size=10, max_size=50)
)


def pick(items: list[T], i: int) -> T | None:
    """The i-th item, wrapping around; None if there are none."""
    return items[i % len(items)] if items else None


def simulate(history: History) -> Log:
    """Run a random history: the test plays agents, health and users; ``plan`` decides, as live."""
    inventory, first, script = history

    def register(i: int) -> None:
        gpus, cpus = inventory[i]
        parts = ("gpu",) if i < 2 else ("gpu", "debug")
        log.add(registered(NAMES[i], gpus=gpus, cpus=cpus, mem_mb=64_000, partitions=parts))

    log = Log()
    for i in range(first):
        register(i)
    for step, then_cycle in script:
        act(log, step, register)
        check_usage(log.state)
        if then_cycle:
            for d in cycle(log, PROPERTY_POLICY, epoch=1).decisions:
                # The fold accepts every allocation the planner makes.
                if isinstance(d, ev.JobAllocated):
                    j = log.state.jobs[d.job_id]
                    assert (j.state, j.restart_count) == ("RUNNING", d.attempt)
            check_usage(log.state)
    return log


def act(log: Log, step: tuple[object, ...], register: Callable[[int], None]) -> None:
    """One action of a user, an agent or the health service (an action on nothing is skipped)."""
    state = log.state
    live = [j for j in state.jobs.values() if j.state == "RUNNING"]
    match step:
        case ("register", int(i)):
            register(i)
        case ("submit", int(gpus), int(nodes), int(cpt), None | str() as part, bool(requeue)):
            spec = job(gpus=gpus, nodes=nodes, cpus_per_task=cpt, partition=part, requeue=requeue)
            log.add(submitted(len(state.jobs) + 1, spec))
        case ("start", int(i)) if (j := pick(live, i)) is not None:
            log.add(
                ev.RunStarted(job_id=j.job_id, attempt=j.restart_count, node=j.allocations[0].node, pid=1)
            )
        case ("exit", int(i), str(how), bool(stale)) if (j := pick(live, i)) is not None:
            # A stale report is a late one for the previous attempt.
            attempt = j.restart_count - 1 if stale else j.restart_count
            log.add(exited(j.job_id, j.allocations[0].node, attempt=attempt, **EXIT_KINDS[how]))
        case ("orphan exit", int(i)) if (o := pick(state.orphans, i)) is not None:
            log.add(exited(o.job_id, o.node, attempt=o.attempt, signal=15, killed=True))
        case ("cancel", int(i)) if state.jobs:
            log.add(ev.JobCancelRequested(job_id=1 + i % len(state.jobs), user="alice"))
        case ("down", int(i)) if NAMES[i] in state.nodes:
            log.add(ev.NodeDown(node=NAMES[i], reason="Not responding"))
        case ("up", int(i)) if NAMES[i] in state.nodes:
            log.add(ev.NodeUp(node=NAMES[i]))


def check_usage(state: State) -> None:
    """No GPU index is held by two running jobs, and node usage is the sum of its running jobs'."""
    holder: dict[tuple[str, int], int] = {}
    for j in state.jobs.values():
        if j.state != "RUNNING":
            continue
        assert j.allocations, f"job {j.job_id} runs on no node"
        assert len({a.node for a in j.allocations}) == len(j.allocations)
        for a in j.allocations:
            for g in a.gpus:
                assert (a.node, g) not in holder, (
                    f"GPU {a.node}:{g} held by {holder[a.node, g]} and {j.job_id}"
                )
                holder[a.node, g] = j.job_id
    for node in state.nodes.values():
        mine = [(j.job_id, a) for j in state.jobs.values() if j.state == "RUNNING" for a in j.allocations]
        mine = [(job_id, a) for job_id, a in mine if a.node == node.name]
        # Orphans (concluded runs still being killed) keep holding their resources.
        mine += [
            (-1, NodeAllocation(node=o.node, gpus=o.gpus, cpus=o.cpus, mem_mb=o.mem_mb))
            for o in state.orphans
            if o.node == node.name
        ]
        for o in state.orphans:
            for g in o.gpus:
                if o.node == node.name:
                    assert (o.node, g) not in holder, f"GPU {o.node}:{g} held by a job and an orphan"
        assert node.used_gpus == sorted(g for _, a in mine for g in a.gpus)
        assert all(0 <= g < node.gpus for g in node.used_gpus)
        assert node.alloc_cpus == sum(a.cpus for _, a in mine) <= node.cpus
        assert node.alloc_mem_mb == sum(a.mem_mb for _, a in mine) <= node.mem_mb
        assert sorted(node.jobs) == sorted(job_id for job_id, _ in mine if job_id != -1)


@settings(max_examples=200, deadline=None)
@given(histories)
def test_no_gpu_is_ever_held_by_two_running_jobs(history: History) -> None:
    simulate(history)


@settings(max_examples=100, deadline=None)
@given(histories, st.integers(0, 200))
def test_fold_of_a_recorded_log_is_deterministic(history: History, cut: int) -> None:
    log = simulate(history)
    live = encode_state(log.state)
    assert encode_state(fold(log.entries)) == encode_state(fold(log.entries)) == live
    cut = min(cut, len(log.entries))
    chunked = fold(log.entries[:cut])
    fold(log.entries[cut:], chunked)
    assert encode_state(chunked) == live


@settings(max_examples=100, deadline=None)
@given(histories)
def test_every_decision_names_an_earlier_entry_as_its_cause(history: History) -> None:
    """``Meta.causation_id`` of every decision is the event id of an entry before it (``causation.py``)."""
    log = simulate(history)
    seen: dict[str, ev.Event] = {}
    for _, envelope in log.entries:
        meta = envelope.meta
        if meta.actor == "scheduler":
            assert meta.causation_id in seen, f"{envelope.body!r} names no earlier entry as its cause"
        seen[meta.event_id] = envelope.body


def test_a_launch_order_carries_the_trace_of_the_submission() -> None:
    """One trace per job: the agent's launch span continues the trace the gateway started at submit."""
    traceparent = "00-0af7651916cd43dd8448eb211dea8f6f-b7ad6b7169203331-01"
    log = Log(*cluster(nodes=1, gpus=8))
    body = submitted(1, job(gpus=1, nodes=1))
    log.append(codec.envelope(body, actor="gw", occurred_at=log.at + 1, traceparent=traceparent))
    cycle(log)
    (launch,) = [o for o in orders(log.state, POLICY) if isinstance(o, api.LaunchOrder)]
    assert launch.traceparent == traceparent


@pytest.mark.parametrize("backfill", ["fifo", "easy"])
def test_a_job_over_its_partitions_limits_waits_with_slurms_reason_and_blocks_nobody(backfill: str) -> None:
    # enforce_part_limits = NO (Slurm's default) lets these in; the scheduler keeps them pending.
    part = dataclasses.replace(partition(max_s=3600), max_nodes=2, size=4)
    pol = dataclasses.replace(policy(part), backfill=backfill)  # type: ignore[arg-type]
    log = Log(*cluster(nodes=4))
    log.add(submitted(1, job(gpus=1, nodes=3)))  # over MaxNodes=2
    log.add(submitted(2, job(gpus=1, nodes=1, time_s=7200)))  # over MaxTime=1 h
    log.add(submitted(3, job(gpus=1, nodes=2)))
    out = cycle(log, pol)
    assert out.reasons[1] == "PartitionNodeLimit" and out.reasons[2] == "PartitionTimeLimit"
    assert set(allocations(out)) == {3}  # behind them, it starts (FIFO does not stop at them)
    bigger = dataclasses.replace(part, max_nodes=None)
    log.add(submitted(4, job(gpus=1, nodes=5)))  # more nodes than the partition has
    assert cycle(log, dataclasses.replace(pol, partitions=(bigger,))).reasons[4] == "PartitionConfig"
