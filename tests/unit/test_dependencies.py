"""Dependencies, holds and begin time: eligibility in the fold and the plan, and their Slurm reasons."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import msgspec
import pytest
from builders import Log, allocated, cluster, exited, job, policy, submitted

from corral.libs.core.eligibility import Singletons, combine, dependency_status, dependency_text
from corral.libs.core.fold import fold
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import Policy
from corral.libs.core.state import encode_state
from corral.libs.slurm.dependency import format_dependency, parse_dependency
from corral.schemas import events as ev
from corral.services.gateway import control
from corral.services.scheduler.views import job_info

pytestmark = pytest.mark.unit

POLICY = policy()
FIFO = dataclasses.replace(POLICY, backfill="fifo")
EIGHT = list(range(8))


def deps(text: str) -> ev.Dependencies:
    """A dependency list written as sbatch -d takes it."""
    parsed = parse_dependency(text)
    assert parsed is not None
    return parsed


def cycle(log: Log, pol: Policy = POLICY) -> Plan:
    """Plan at the log's time and append the decisions, as the live scheduler does."""
    out = plan(log.state, log.state.now, pol)
    log.add(*out.decisions)
    return out


def started(out: Plan) -> list[int]:
    """Ids of the jobs a plan allocates."""
    return [d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)]


# How a dependee (one whole node) gets to each state; "pending" is kept from starting by a hold.
def _pending(log: Log, job_id: int, node: str) -> None:
    log.add(ev.JobHeld(job_id=job_id, by="alice"))


def _running(log: Log, job_id: int, node: str) -> None:
    log.add(allocated(job_id, {node: EIGHT}))


def _completed(log: Log, job_id: int, node: str) -> None:
    _running(log, job_id, node)
    log.add(exited(job_id, node), ev.JobCompleted(job_id=job_id, attempt=0))


def _failed(log: Log, job_id: int, node: str) -> None:
    _running(log, job_id, node)
    log.add(
        exited(job_id, node, exit_code=3),
        ev.JobFailed(job_id=job_id, attempt=0, reason="NonZeroExitCode", exit_code=3),
    )


def _cancelled(log: Log, job_id: int, node: str) -> None:
    log.add(
        ev.JobCancelRequested(job_id=job_id, user="alice"),
        ev.JobCancelled(job_id=job_id, attempt=-1, by="alice"),
    )


def _timeout(log: Log, job_id: int, node: str) -> None:
    _running(log, job_id, node)
    log.add(ev.JobFailed(job_id=job_id, attempt=0, reason="TimeLimit", signal=15))


def _requeued(log: Log, job_id: int, node: str) -> None:
    _running(log, job_id, node)
    log.add(ev.JobRequeued(job_id=job_id, attempt=0, reason="NodeFail"))


DEPENDEE: dict[str, Callable[[Log, int, str], None]] = {
    "pending": _pending,
    "running": _running,
    "completed": _completed,
    "failed": _failed,
    "cancelled": _cancelled,
    "timeout": _timeout,
    "requeued": _requeued,
}

# Pending reason of the dependent job for each dependency type and dependee state (None: eligible).
W, N = "Dependency", "DependencyNeverSatisfied"
EXPECTED: dict[str, dict[str, str | None]] = {
    #               pending running completed failed cancelled timeout requeued
    "after": dict(zip(DEPENDEE, [W, None, None, None, None, None, None], strict=True)),
    "afterany": dict(zip(DEPENDEE, [W, W, None, None, None, None, W], strict=True)),
    "afterok": dict(zip(DEPENDEE, [W, W, None, N, N, N, W], strict=True)),
    "afternotok": dict(zip(DEPENDEE, [W, W, N, None, None, None, W], strict=True)),
}
CASES = [(kind, state, reason) for kind, row in EXPECTED.items() for state, reason in row.items()]


def with_dependee(state: str, dependency: str, *, nodes: int = 3) -> Log:
    """Job 1 (dependee) brought to ``state``; job 2 (one node) depends on it with ``dependency``."""
    log = Log(*cluster(nodes=nodes))
    log.add(submitted(1, job(nodes=1)), submitted(2, job(nodes=1, dependencies=deps(dependency))))
    DEPENDEE[state](log, 1, "gpu01")
    return log


@pytest.mark.parametrize(("kind", "state", "reason"), CASES, ids=[f"{k}-{s}" for k, s, _ in CASES])
def test_each_dependency_type_against_each_dependee_state(kind: str, state: str, reason: str | None) -> None:
    log = with_dependee(state, f"{kind}:1")
    out = plan(log.state, log.state.now, POLICY)
    assert out.reasons.get(2) == reason
    assert (2 in started(out)) == (reason is None)
    assert 2 not in out.starts


def test_a_requeued_dependee_still_counts_as_started_for_after() -> None:
    log = with_dependee("requeued", "after:1")
    assert log.state.jobs[1].state == "PENDING"
    assert dependency_status(log.state, log.state.jobs[2]) == "met"


ANY_OF = [
    ("afterok:1?afterok:3", "failed", "pending", "Dependency"),
    ("afterok:1?afterok:3", "failed", "failed", "DependencyNeverSatisfied"),
    ("afterok:1?afterok:3", "failed", "completed", None),
    ("afterok:1:3", "completed", "failed", "DependencyNeverSatisfied"),
    ("afterok:1,afterany:3", "completed", "running", "Dependency"),
    ("afterok:1,afterany:3", "completed", "failed", None),
    ("afternotok:1?afterok:3", "completed", "completed", None),
]


@pytest.mark.parametrize(
    ("text", "first", "third", "reason"),
    ANY_OF,
    ids=[f"{t} {a}/{b}" for t, a, b, _ in ANY_OF],
)
def test_all_of_and_any_of(text: str, first: str, third: str, reason: str | None) -> None:
    """Job 4 depends on jobs 1 and 3; they are brought to ``first`` and ``third``."""
    log = Log(*cluster(nodes=3))
    log.add(submitted(1, job(nodes=1)), submitted(3, job(nodes=1)))
    log.add(submitted(4, job(nodes=1, dependencies=deps(text))))
    DEPENDEE[first](log, 1, "gpu01")
    DEPENDEE[third](log, 3, "gpu03")
    out = plan(log.state, log.state.now, POLICY)
    assert out.reasons.get(4) == reason


@pytest.mark.parametrize(
    ("statuses", "any_of", "expected"),
    [
        ([], False, "met"),
        (["met", "met"], False, "met"),
        (["met", "waiting"], False, "waiting"),
        (["waiting", "never"], False, "never"),
        (["never", "waiting"], True, "waiting"),
        (["never", "never"], True, "never"),
        (["never", "met"], True, "met"),
    ],
    ids=[
        "empty",
        "all met",
        "all-of waiting",
        "all-of never",
        "any-of waiting",
        "any-of never",
        "any-of met",
    ],
)
def test_combine(statuses: list[str], any_of: bool, expected: str) -> None:
    assert combine(statuses, any_of) == expected  # type: ignore[arg-type]


def test_a_dependent_job_blocks_nothing_and_gets_no_reservation() -> None:
    """FIFO: a job waiting on a dependency does not stop the job behind it, nor reserve anything."""
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, time_s=600)))
    cycle(log, FIFO)  # job 1 runs on the only node
    log.add(submitted(2, job(gpus=8, nodes=1, dependencies=deps("afterok:1"))))
    log.add(submitted(3, job(gpus=8, nodes=1)))
    out = plan(log.state, log.state.now, POLICY)
    assert out.reasons == {2: "Dependency", 3: "Resources"}
    assert list(out.starts) == [3]


def test_an_afterok_chain_runs_in_order() -> None:
    log = Log(*cluster(nodes=2))
    log.add(
        submitted(1, job(nodes=1)),
        submitted(2, job(nodes=1, dependencies=deps("afterok:1"))),
        submitted(3, job(nodes=1, dependencies=deps("afterok:2"))),
    )
    assert started(cycle(log)) == [1]
    for job_id in (1, 2):
        node = log.state.jobs[job_id].allocations[0].node
        log.add(exited(job_id, node), ev.JobCompleted(job_id=job_id, attempt=0))
        assert started(cycle(log)) == [job_id + 1]


SINGLETON = [
    ("same name and user", "train", "alice", "Dependency"),
    ("other name", "eval", "alice", None),
    ("other user", "train", "bob", None),
]


@pytest.mark.parametrize(
    ("name", "user", "reason"), [c[1:] for c in SINGLETON], ids=[c[0] for c in SINGLETON]
)
def test_singleton_waits_for_a_running_job_of_the_same_name_and_user(
    name: str, user: str, reason: str | None
) -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, name="train")))
    cycle(log)
    log.add(submitted(2, job(nodes=1, name=name, dependencies=deps("singleton")), user=user))
    out = plan(log.state, log.state.now, POLICY)
    assert out.reasons.get(2) == reason


def test_of_two_pending_singletons_the_earlier_runs_first() -> None:
    log = Log(*cluster(nodes=2))
    log.add(
        submitted(1, job(nodes=1, dependencies=deps("singleton"))),
        submitted(2, job(nodes=1, dependencies=deps("singleton"))),
    )
    out = cycle(log)
    assert (started(out), out.reasons) == ([1], {2: "Dependency"})
    log.add(exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0))
    assert started(cycle(log)) == [2]


def test_a_singleton_also_waits_for_a_later_job_that_runs() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, held=True, dependencies=deps("singleton"))), submitted(2, job(nodes=1)))
    cycle(log)  # job 2 runs, job 1 is held
    log.add(ev.JobReleaseRequested(job_id=1, user="alice"))
    cycle(log)  # released
    assert plan(log.state, log.state.now, POLICY).reasons == {1: "Dependency"}


def test_a_job_submitted_held_waits_until_released() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, held=True)))
    assert log.state.jobs[1].held == "user"
    out = cycle(log)
    assert (out.decisions, out.reasons, out.priorities) == ([], {1: "JobHeldUser"}, {1: 0})
    log.add(ev.JobReleaseRequested(job_id=1, user="alice"))
    out = cycle(log)
    assert out.decisions == [ev.JobReleased(job_id=1, by="alice")]  # placed next cycle
    assert log.state.jobs[1].held == "" and log.state.jobs[1].control is None
    assert started(cycle(log)) == [1]


def test_a_hold_request_holds_the_job_before_it_can_start() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1)), ev.JobHoldRequested(job_id=1, user="alice"))
    out = cycle(log)
    assert out.decisions == [ev.JobHeld(job_id=1, by="alice")]
    assert cycle(log).reasons == {1: "JobHeldUser"}


CONTROLS = [
    # (held before, request, admin, decision)
    ("", "hold", False, ev.JobHeld(job_id=1, by="u")),
    ("", "hold", True, ev.JobHeld(job_id=1, by="u", admin=True)),
    ("user", "hold", False, None),
    ("user", "hold", True, ev.JobHeld(job_id=1, by="u", admin=True)),
    ("admin", "hold", False, None),
    ("user", "release", False, ev.JobReleased(job_id=1, by="u")),
    ("admin", "release", False, None),
    ("admin", "release", True, ev.JobReleased(job_id=1, by="u")),
    ("", "release", False, None),
]


@pytest.mark.parametrize(
    ("held", "asked", "admin", "decision"),
    CONTROLS,
    ids=[f"{h or 'free'}-{r}-{'admin' if a else 'user'}" for h, r, a, _ in CONTROLS],
)
def test_hold_and_release_requests(held: str, asked: str, admin: bool, decision: ev.Event | None) -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, held=held == "user")))
    if held == "admin":
        log.add(ev.JobHeld(job_id=1, by="root", admin=True))
    intent = ev.JobHoldRequested if asked == "hold" else ev.JobReleaseRequested
    log.add(intent(job_id=1, user="u", admin=admin))
    out = plan(log.state, log.state.now, POLICY)
    control_decisions = [d for d in out.decisions if isinstance(d, ev.JobHeld | ev.JobReleased)]
    assert control_decisions == ([decision] if decision else [])
    if decision is not None:
        assert started(out) == []  # a job whose hold is being decided is not placed in the same cycle


def test_a_hold_request_of_a_running_job_changes_nothing() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1)))
    cycle(log)
    log.add(ev.JobHoldRequested(job_id=1, user="alice"), ev.JobHeld(job_id=1, by="alice"))
    j = log.state.jobs[1]
    assert (j.state, j.held, j.control) == ("RUNNING", "", None)
    assert plan(log.state, log.state.now, POLICY).decisions == []


def test_the_fold_refuses_to_allocate_a_held_job() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, held=True)), allocated(1, {"gpu01": EIGHT}))
    assert log.state.jobs[1].state == "PENDING"
    assert log.state.nodes["gpu01"].used_gpus == []


def test_a_held_job_can_be_cancelled() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, held=True)), ev.JobCancelRequested(job_id=1, user="alice"))
    cycle(log)
    assert log.state.jobs[1].state == "CANCELLED"


def test_begin_time_waits_for_now_and_sets_the_wake_up() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, begin_time=log.at + 100)))
    begin = log.state.jobs[1].spec.begin_time
    assert begin is not None
    out = plan(log.state, begin - 1, POLICY)
    assert (out.decisions, out.reasons, out.wake_at, out.starts) == ([], {1: "BeginTime"}, begin, {})
    assert started(plan(log.state, begin, POLICY)) == [1]


def test_a_begin_time_job_does_not_block_fifo() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, begin_time=log.at + 100)), submitted(2, job(nodes=1)))
    out = plan(log.state, log.state.now, FIFO)
    assert (started(out), out.reasons) == ([2], {1: "BeginTime"})


REASON_ORDER = [
    ({"held": True, "dependencies": deps("afterok:1")}, "JobHeldUser"),
    ({"dependencies": deps("afterok:1"), "begin_time": 1e12}, "Dependency"),
    ({"dependencies": deps("afterok:2"), "begin_time": 1e12}, "DependencyNeverSatisfied"),
    ({"begin_time": 1e12}, "BeginTime"),
]


@pytest.mark.parametrize(("fields", "reason"), REASON_ORDER, ids=[r for _, r in REASON_ORDER])
def test_which_reason_shows_first(fields: dict[str, object], reason: str) -> None:
    """Job 1 is held (pending), job 2 failed; job 3 has a hold, dependencies and a begin time."""
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, held=True)), submitted(2, job(nodes=1)))
    _failed(log, 2, "gpu02")
    log.add(submitted(3, job(nodes=1, **fields)))
    assert plan(log.state, log.state.now, POLICY).reasons[3] == reason


def test_replay_gives_the_live_state_with_holds_and_dependencies() -> None:
    log = Log(*cluster(nodes=2))
    log.add(
        submitted(1, job(nodes=1)),
        submitted(2, job(nodes=1, held=True, dependencies=deps("afterany:1"))),
        submitted(3, job(nodes=1, dependencies=deps("singleton"))),
    )
    for _ in range(3):
        cycle(log)
    log.add(ev.JobReleaseRequested(job_id=2, user="alice"), exited(1, "gpu01"))
    for _ in range(4):
        cycle(log)
    assert encode_state(fold(log.entries)) == encode_state(log.state)


def test_dependency_text_shows_what_is_not_met() -> None:
    log = with_dependee("failed", "afterok:1,afterany:3,after:1")
    log.add(submitted(3, job(nodes=1, held=True)))
    assert dependency_text(log.state, log.state.jobs[2]) == "afterok:1(failed),afterany:3(unfulfilled)"
    log = with_dependee("completed", "afterok:1")
    assert dependency_text(log.state, log.state.jobs[2]) == ""


def test_the_job_view_shows_the_hold_and_the_dependency() -> None:
    log = with_dependee("running", "afterok:1")
    log.add(ev.JobHeld(job_id=2, by="alice"))
    info = job_info(log.state.jobs[2], Plan(), POLICY, dependency_text(log.state, log.state.jobs[2]))
    assert (info.reason, info.priority, info.dependency) == ("JobHeldUser", 0, "afterok:1(unfulfilled)")


def test_singletons_index_is_built_once() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1)), submitted(2, job(nodes=1, dependencies=deps("singleton"))))
    ones = Singletons(log.state)
    assert ones.blocked(log.state.jobs[2]) and not ones.blocked(log.state.jobs[1])


PARSE = [
    ("afterok:5", "afterok:5", False),
    ("afterok:5:6,afterany:7", "afterok:5,afterok:6,afterany:7", False),
    ("afterok:5?afternotok:6", "afterok:5?afternotok:6", True),
    ("AFTER:5,singleton", "after:5,singleton", False),
]


@pytest.mark.parametrize(("text", "shown", "any_of"), PARSE, ids=[p[0] for p in PARSE])
def test_dependency_lists_parse_and_print_back(text: str, shown: str, any_of: bool) -> None:
    parsed = parse_dependency(text)
    assert parsed is not None and parsed.any_of is any_of
    assert format_dependency(parsed) == shown
    assert parse_dependency(shown) == parsed


GATEWAY_PHASES = [
    (None, None),
    (ev.JobSubmitted(job_id=1, user="a", spec=job()), None),
    (ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"), None),
    (
        ev.JobAllocated(job_id=1, attempt=0, partition="gpu", allocations=[], time_limit_s=None),
        control.NOT_PENDING,
    ),
    (ev.RunStarted(job_id=1, attempt=0, node="n", pid=1), control.NOT_PENDING),
    # A preempted job runs until its run's exit is reported: it is not pending.
    (ev.JobPreempted(job_id=1, attempt=0, mode="requeue", by_job=2), control.NOT_PENDING),
    (ev.JobCompleted(job_id=1, attempt=0), control.ALREADY_DONE),
    (ev.JobCancelled(job_id=1, attempt=-1, by="a"), control.ALREADY_DONE),
]


@pytest.mark.parametrize(
    ("latest", "problem"), GATEWAY_PHASES, ids=[type(latest).__name__ for latest, _ in GATEWAY_PHASES]
)
def test_the_gateway_refuses_to_hold_a_job_that_runs_or_ended(
    latest: ev.Event | None, problem: str | None
) -> None:
    assert control.phase_problem(latest) == problem


def test_the_gateway_knows_an_admin_hold() -> None:
    admin_held = (5, ev.JobHeld(job_id=1, by="root", admin=True))
    assert control.admin_hold(admin_held, None)
    assert control.admin_hold(admin_held, (3, ev.JobReleased(job_id=1, by="root")))
    assert not control.admin_hold(admin_held, (7, ev.JobReleased(job_id=1, by="root")))
    assert not control.admin_hold((5, ev.JobHeld(job_id=1, by="alice")), None)


# scontrol update JobId=: an intent the scheduler answers with JobUpdated, for pending jobs only.


def test_an_update_changes_the_time_limit_of_a_pending_job() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, held=True, partition="gpu", time_s=3600)))
    log.add(ev.JobUpdateRequested(job_id=1, user="alice", time_limit_s=600))
    out = cycle(log)
    assert out.decisions == [ev.JobUpdated(job_id=1, by="alice", time_limit_s=600, partition="gpu")]
    assert (log.state.jobs[1].spec.time_limit_s, log.state.jobs[1].change) == (600, None)
    log.add(ev.JobReleaseRequested(job_id=1, user="alice"))
    cycle(log)
    (allocation,) = [d for d in cycle(log).decisions if isinstance(d, ev.JobAllocated)]
    assert allocation.time_limit_s == 600


def test_update_requests_merge_until_answered_and_move_the_job() -> None:
    log = Log(*cluster(nodes=1), *cluster(nodes=1, prefix="cpu", gpus=0, partitions=("cpu",)))
    log.add(submitted(1, job(gpus=0, nodes=1, held=True, partition="gpu")))
    log.add(
        ev.JobUpdateRequested(job_id=1, user="alice", partition="cpu"),
        ev.JobUpdateRequested(job_id=1, user="root", admin=True, time_limit_s=60),
    )
    assert cycle(log).decisions == [ev.JobUpdated(job_id=1, by="root", time_limit_s=60, partition="cpu")]
    log.add(ev.JobReleaseRequested(job_id=1, user="alice"))
    cycle(log)
    out = cycle(log)
    assert [a.node for d in out.decisions if isinstance(d, ev.JobAllocated) for a in d.allocations] == [
        "cpu01"
    ]


def test_an_update_of_a_running_job_changes_nothing() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1)))
    cycle(log)
    log.add(ev.JobUpdateRequested(job_id=1, user="alice", time_limit_s=60))
    assert log.state.jobs[1].change is None
    assert plan(log.state, log.state.now, POLICY).decisions == []


def test_the_gateway_sees_the_spec_of_the_newest_update() -> None:
    spec = job(partition="gpu", time_s=3600)
    assert control.current_spec(spec, None) == spec
    newest = (9, ev.JobUpdated(job_id=1, by="a", time_limit_s=60, partition="cpu"))
    assert control.current_spec(spec, newest) == msgspec.structs.replace(
        spec, time_limit_s=60, partition="cpu"
    )
