"""Ended jobs are forgotten by the fold once MinJobAge old by the log's clock (``libs/core/retention.py``),
unless a live job depends on them or a task of their array is live; a forgotten id stays a duplicate."""

from __future__ import annotations

import msgspec
import pytest
from builders import T0, Log, allocated, cluster, env, exited, job, submitted

from corral.libs.core.fold import fold
from corral.libs.core.state import State, decode_state, encode_state
from corral.schemas import events as ev
from corral.services.accounting.folded import Projector
from corral.services.feed.project import Projector as FeedProjector

pytestmark = pytest.mark.unit

AGE = 300.0


def log_forgetting(age: float = AGE) -> Log:
    """A one-node cluster's log whose fold forgets ended jobs ``age`` seconds after their end."""
    log = Log()
    log.state.min_job_age_s = age
    for e in cluster(nodes=1):
        log.append(e)
    return log


def run_to_completion(log: Log, job_id: int) -> float:
    """Job ``job_id`` (pending) allocated on gpu01, run and completed; the time it ended."""
    log.add(allocated(job_id, {"gpu01": [0]}))
    log.add(exited(job_id, "gpu01"), ev.JobCompleted(job_id=job_id, attempt=0))
    end = log.state.jobs[job_id].end_time
    assert end is not None
    return end


def at(log: Log, when: float, body: ev.Event) -> None:
    """Append ``body`` at ``when`` (the log's clock moves there)."""
    log.append(env(body, at=when))


def test_an_ended_job_is_forgotten_min_job_age_after_its_end() -> None:
    log = log_forgetting()
    log.add(submitted(1, job(gpus=1, nodes=1)))
    end = run_to_completion(log, 1)
    at(log, end + AGE - 1, submitted(2, job(gpus=1, nodes=1)))
    assert log.state.jobs[1].state == "COMPLETED"
    at(log, end + AGE, submitted(3, job(gpus=1, nodes=1)))
    assert 1 not in log.state.jobs and sorted(log.state.jobs) == [2, 3]
    # Its id is still taken: a submission naming it changes nothing, as while it was kept.
    before = encode_state(log.state)
    at(log, end + AGE + 1, submitted(1, job(gpus=1, nodes=1), user="mallory"))
    assert 1 not in log.state.jobs
    assert msgspec.structs.replace(decode_state(before), last_seq=log.state.last_seq, now=log.state.now) == (
        log.state
    )
    # And a late fact about it is folded as one about a job never seen.
    at(log, end + AGE + 2, ev.JobCancelRequested(job_id=1, user="alice"))
    assert 1 not in log.state.jobs


def test_every_job_is_kept_without_a_min_job_age() -> None:
    log = log_forgetting(age=0.0)
    log.add(submitted(1, job(gpus=1, nodes=1)))
    end = run_to_completion(log, 1)
    at(log, end + 30 * 86400, submitted(2, job(gpus=1, nodes=1)))
    assert log.state.jobs[1].state == "COMPLETED" and log.state.ended == []


def test_a_job_a_live_job_depends_on_is_kept_until_that_one_ends() -> None:
    log = log_forgetting()
    waits = ev.Dependencies(items=[ev.Dependency(type="afterok", job_id=1)])
    log.add(submitted(1, job(gpus=1, nodes=1)), submitted(2, job(gpus=1, nodes=1, dependencies=waits)))
    log.add(allocated(1, {"gpu01": [0]}))
    log.add(exited(1, "gpu01", exit_code=3), ev.JobFailed(job_id=1, attempt=0, reason="NonZeroExitCode"))
    end = log.state.jobs[1].end_time
    assert end is not None and log.state.jobs[1].state == "FAILED"
    # Job 2 can never run (afterok on a failure): forgetting job 1 would make its dependency met.
    at(log, end + 3 * AGE, submitted(3, job(gpus=1, nodes=1)))
    assert log.state.jobs[1].state == "FAILED"
    at(log, end + 3 * AGE + 1, ev.JobCancelled(job_id=2, attempt=-1, by="alice"))
    at(log, end + 4 * AGE - 1, submitted(4, job(gpus=1, nodes=1)))
    assert log.state.jobs[1].state == "FAILED"  # looked at again an age after it was found still needed
    at(log, end + 4 * AGE + 1, submitted(5, job(gpus=1, nodes=1)))
    assert sorted(log.state.jobs) == [3, 4, 5] and log.state.depended == {}


def test_an_arrays_tasks_are_kept_while_any_task_of_it_is_live() -> None:
    log = log_forgetting()
    three = ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=2)])
    log.add(submitted(10, job(gpus=1, nodes=1, array=three)))
    assert sorted(log.state.jobs) == [10, 11, 12]
    run_to_completion(log, 10)
    end = run_to_completion(log, 11)
    at(log, end + 2 * AGE, submitted(20, job(gpus=1, nodes=1)))
    assert sorted(log.state.jobs) == [10, 11, 12, 20]  # task 12 is still pending
    end = run_to_completion(log, 12)
    at(log, end + 2 * AGE, submitted(21, job(gpus=1, nodes=1)))
    assert sorted(log.state.jobs) == [20, 21] and log.state.array_live == {}
    # Every id of the array is taken still.
    at(log, end + 2 * AGE + 1, submitted(11, job(gpus=1, nodes=1)))
    assert 11 not in log.state.jobs


def test_a_replay_and_a_snapshot_forget_what_the_live_fold_forgot() -> None:
    log = log_forgetting()
    for job_id in range(1, 6):
        log.add(submitted(job_id, job(gpus=1, nodes=1)))
        run_to_completion(log, job_id)
        log.add(submitted(100 + job_id, job(gpus=1, nodes=1)), step=AGE / 2)
    entries = log.entries
    assert len(log.state.jobs) < 10  # some ended jobs were forgotten
    replayed = fold(entries, State(min_job_age_s=AGE))
    assert encode_state(replayed) == encode_state(log.state)
    half = len(entries) // 2
    restarted = decode_state(encode_state(fold(entries[:half], State(min_job_age_s=AGE))))
    assert encode_state(fold(entries[half:], restarted)) == encode_state(log.state)
    assert log.at > T0


def test_accounting_writes_the_same_rows_whether_its_fold_forgets_or_not() -> None:
    # Accounting folds the log as the scheduler does, and records only what the fold applied: an entry
    # about a forgotten job is one the fold ignored while it kept the job, so the operations are the same.
    log = log_forgetting(age=0.0)
    waits = ev.Dependencies(items=[ev.Dependency(type="afterany", job_id=1)])
    for job_id in range(1, 9):
        spec = job(gpus=1, nodes=1, dependencies=waits) if job_id == 4 else job(gpus=1, nodes=1)
        log.add(submitted(job_id, spec), step=AGE / 2)
        if job_id % 3:
            run_to_completion(log, job_id)
        else:
            log.add(ev.JobCancelled(job_id=job_id, attempt=-1, by="alice"))
    # Late facts about long-ended jobs: a cancel request, a duplicate submission, a node's late exit report.
    log.add(ev.JobCancelRequested(job_id=1, user="alice"), step=AGE)
    log.add(submitted(2, job(gpus=1, nodes=1), user="mallory"))
    log.add(exited(5, "gpu01", exit_code=9))
    keeping, forgetting = Projector("gpu"), Projector("gpu", min_job_age_s=AGE)
    kept_ops = keeping.operations(log.entries)
    assert forgetting.operations(log.entries) == kept_ops
    assert len(forgetting.state.jobs) < len(keeping.state.jobs) == 8


def test_the_feed_says_the_same_whether_its_fold_forgets_or_not() -> None:
    # Among them a submission (one job, then an array) folded by the entry that makes the fold forget
    # ended jobs: the feed counted the jobs an entry added, and would have missed these.
    log = log_forgetting(age=0.0)
    log.add(submitted(1, job(gpus=1, nodes=1)))
    end = run_to_completion(log, 1)
    at(log, end + AGE, submitted(2, job(gpus=1, nodes=1)))
    end = run_to_completion(log, 2)
    three = ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=2)])
    at(log, end + AGE, submitted(10, job(gpus=1, nodes=1, array=three)))
    keeping, forgetting = FeedProjector(), FeedProjector(min_job_age_s=AGE)
    said = [m for seq, e in log.entries for m in keeping.add(seq, e)]
    assert [m for seq, e in log.entries for m in forgetting.add(seq, e)] == said
    assert sorted(forgetting.state.jobs) == [10, 11, 12]
    assert sum(m.subject.endswith(".submitted") for m in said) == 5
