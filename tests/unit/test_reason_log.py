"""The pending reason log: a cycle logs a job's reason only when it changed since the last one logged for the
same attempt, once per job; the fold remembers it, so a replay or a snapshot logs nothing again."""

from __future__ import annotations

import pytest
from builders import Log, allocated, cluster, exited, job, policy, submitted

from corral.libs.core.fold import fold
from corral.libs.core.plan import plan
from corral.libs.core.reason_log import reason_changes
from corral.libs.core.state import decode_state, encode_state
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

POLICY = policy()
EIGHT = list(range(8))


def changes(log: Log) -> list[ev.JobReasonChanged]:
    """One cycle as the scheduler runs it: its decisions, then the reason changes, all appended."""
    out = plan(log.state, log.state.now, POLICY)
    logged = reason_changes(log.state, out.reasons, out.details)
    log.add(*out.decisions, *logged)
    return logged


def reasons(logged: list[ev.JobReasonChanged]) -> list[tuple[int, int, str]]:
    return [(c.job_id, c.attempt, c.reason) for c in logged]


def busy() -> Log:
    """One node, busy with job 1; jobs 2 and 3 (a whole node each) wait behind it."""
    log = Log(*cluster(nodes=1))
    log.add(submitted(1), allocated(1, {"gpu01": EIGHT}), submitted(2), submitted(3))
    return log


def test_a_waiting_job_logs_its_reason_once_then_nothing_while_it_is_unchanged() -> None:
    log = busy()
    assert reasons(changes(log)) == [(2, 0, "Resources"), (3, 0, "Priority")]
    assert changes(log) == []
    assert changes(log) == []


def test_a_replayed_or_snapshotted_state_logs_no_unchanged_reason_again() -> None:
    log = busy()
    changes(log)
    replayed = fold(log.entries)
    out = plan(replayed, replayed.now, POLICY)
    assert reason_changes(replayed, out.reasons, out.details) == []
    loaded = decode_state(encode_state(log.state))
    out = plan(loaded, loaded.now, POLICY)
    assert reason_changes(loaded, out.reasons, out.details) == []


def test_a_change_of_reason_is_logged_and_a_started_job_logs_none() -> None:
    log = busy()
    changes(log)
    log.add(ev.JobHeld(job_id=2, by="alice"))
    # Job 2 is held: its reason changes, and job 3 is now the first to wait for the node.
    assert reasons(changes(log)) == [(2, 0, "JobHeldUser"), (3, 0, "Resources")]
    log.add(exited(1, "gpu01"))
    logged = changes(log)  # job 1 concludes; job 3 starts in the same cycle and logs nothing
    assert logged == []
    assert log.state.jobs[3].state == "RUNNING"


def test_a_detail_change_is_a_change_and_the_detail_is_logged() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, nodelist=["gpu02"])))
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    [first] = changes(log)
    assert (first.reason, first.detail) == ("ReqNodeNotAvail", "UnavailableNodes:gpu02")
    assert changes(log) == []


def test_a_requeued_job_logs_its_reason_again_for_its_next_attempt() -> None:
    log = busy()
    changes(log)
    log.add(ev.JobRequeueRequested(job_id=1, user="alice"), exited(1, "gpu01", signal=15))
    # Job 1 is requeued and job 2 takes the node in that cycle; job 3 is first to wait now.
    assert reasons(changes(log)) == [(3, 0, "Resources")]
    # Job 1 waits again, in its attempt 1 (the same Resources job 2 once had is a change for it), ahead of 3.
    assert reasons(changes(log)) == [(1, 1, "Resources"), (3, 0, "Priority")]
    assert changes(log) == []


def test_the_fold_ignores_a_reason_of_another_attempt_or_a_job_that_is_not_pending() -> None:
    log = busy()
    log.add(ev.JobReasonChanged(job_id=ev.JobId(2), attempt=1, reason="Resources"))
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=0, reason="Resources"))
    assert log.state.jobs[2].logged_reason is None and log.state.jobs[1].logged_reason is None
    # The entries still move the jobs' subject sequence (the next conditional append compares with it).
    assert log.state.jobs[2].last_seq == len(log.entries) - 1
