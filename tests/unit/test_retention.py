"""Ended jobs are forgotten by the fold once MinJobAge old by the log's clock (``libs/core/retention.py``),
unless a live job depends on them or a task of their array is live; a forgotten id stays a duplicate."""

from __future__ import annotations

import msgspec
import pytest
from builders import T0, Log, allocated, cluster, env, exited, job, submitted

from corral.libs.config.cluster import parse_config
from corral.libs.config.policy import policy_of
from corral.libs.core import fold as fold_module
from corral.libs.core.fold import fold
from corral.libs.core.plan import Plan
from corral.libs.core.state import State, decode_state, encode_state
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.accounting.folded import Projector
from corral.services.feed.project import Projector as FeedProjector
from corral.services.scheduler.views import jobs_reply

pytestmark = pytest.mark.unit

AGE = 300.0
CLUSTER = """
[[nodes]]
names = "gpu01"
cpus = 64
memory = "512G"
gpus = 8

[[partitions]]
name = "gpu"
nodes = "gpu01"
default = true
"""


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


def tick(log: Log, when: float) -> None:
    """An entry at ``when`` that changes nothing but the clock (a cancel request for no job): what was due
    by the clock before it is forgotten as it is folded."""
    at(log, when, ev.JobCancelRequested(job_id=999_999, user="nobody"))


def test_an_ended_job_is_forgotten_min_job_age_after_its_end() -> None:
    log = log_forgetting()
    log.add(submitted(1, job(gpus=1, nodes=1)))
    end = run_to_completion(log, 1)
    at(log, end + AGE - 1, submitted(2, job(gpus=1, nodes=1)))
    assert log.state.jobs[1].state == "COMPLETED"
    at(log, end + AGE, submitted(3, job(gpus=1, nodes=1)))
    assert log.state.jobs[1].state == "COMPLETED"  # (an entry's own time counts from the next entry on)
    tick(log, end + AGE + 1)
    assert 1 not in log.state.jobs and sorted(log.state.jobs) == [2, 3]
    # Its id is still taken: a submission naming it changes nothing, as while it was kept.
    before = encode_state(log.state)
    at(log, end + AGE + 2, submitted(1, job(gpus=1, nodes=1), user="mallory"))
    assert 1 not in log.state.jobs
    assert msgspec.structs.replace(decode_state(before), last_seq=log.state.last_seq, now=log.state.now) == (
        log.state
    )
    # And a late fact about it is folded as one about a job never seen.
    at(log, end + AGE + 3, ev.JobCancelRequested(job_id=1, user="alice"))
    assert 1 not in log.state.jobs


def test_every_job_is_kept_without_a_min_job_age() -> None:
    log = log_forgetting(age=0.0)
    log.add(submitted(1, job(gpus=1, nodes=1)))
    end = run_to_completion(log, 1)
    at(log, end + 30 * 86400, submitted(2, job(gpus=1, nodes=1)))
    assert log.state.jobs[1].state == "COMPLETED" and log.state.ended == []


def needed_dependee() -> Log:
    """Job 1 failed (at the log's clock) and job 2 waits on ``afterok:1`` for ever: job 1 is needed."""
    log = log_forgetting()
    waits = ev.Dependencies(items=[ev.Dependency(type="afterok", job_id=1)])
    log.add(submitted(1, job(gpus=1, nodes=1)), submitted(2, job(gpus=1, nodes=1, dependencies=waits)))
    log.add(allocated(1, {"gpu01": [0]}))
    log.add(exited(1, "gpu01", exit_code=3), ev.JobFailed(job_id=1, attempt=0, reason="NonZeroExitCode"))
    return log


def test_a_job_a_live_job_depends_on_is_kept_until_that_one_ends() -> None:
    log = needed_dependee()
    end = log.state.jobs[1].end_time
    assert end is not None and log.state.jobs[1].state == "FAILED"
    # Job 2 can never run (afterok on a failure): forgetting job 1 would make its dependency met.
    at(log, end + 3 * AGE, submitted(3, job(gpus=1, nodes=1)))
    tick(log, end + 3 * AGE + 0.5)
    assert log.state.jobs[1].state == "FAILED" and log.state.parked == {1: [1]}
    at(log, end + 3 * AGE + 1, ev.JobCancelled(job_id=2, attempt=-1, by="alice"))
    assert log.state.parked == {}  # back in the queue, as of job 2's end
    at(log, end + 4 * AGE, submitted(4, job(gpus=1, nodes=1)))
    tick(log, end + 4 * AGE + 0.5)
    assert log.state.jobs[1].state == "FAILED"  # an age after it stopped being needed, not before
    at(log, end + 4 * AGE + 2, submitted(5, job(gpus=1, nodes=1)))
    tick(log, end + 4 * AGE + 3)
    assert sorted(log.state.jobs) == [3, 4, 5] and log.state.depended == {}


def test_an_arrays_tasks_are_kept_while_any_task_of_it_is_live() -> None:
    log = log_forgetting()
    three = ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=2)])
    log.add(submitted(10, job(gpus=1, nodes=1, array=three)))
    assert sorted(log.state.jobs) == [10, 11, 12]
    run_to_completion(log, 10)
    end = run_to_completion(log, 11)
    at(log, end + 2 * AGE, submitted(20, job(gpus=1, nodes=1)))
    tick(log, end + 2 * AGE + 1)
    assert sorted(log.state.jobs) == [10, 11, 12, 20]  # task 12 is still pending
    assert log.state.parked == {10: [10, 11]}
    end = run_to_completion(log, 12)
    at(log, end + 2 * AGE, submitted(21, job(gpus=1, nodes=1)))
    tick(log, end + 2 * AGE + 1)
    assert sorted(log.state.jobs) == [20, 21] and (log.state.array_live, log.state.parked) == ({}, {})
    # Every id of the array is taken still.
    at(log, end + 2 * AGE + 2, submitted(11, job(gpus=1, nodes=1)))
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
    tick(log, end + AGE)
    at(log, end + AGE + 1, submitted(2, job(gpus=1, nodes=1)))  # (job 1 forgotten by this entry)
    end = run_to_completion(log, 2)
    three = ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=2)])
    tick(log, end + AGE)
    at(log, end + AGE + 1, submitted(10, job(gpus=1, nodes=1, array=three)))  # (and job 2 by this one)
    keeping, forgetting = FeedProjector(), FeedProjector(min_job_age_s=AGE)
    said = [m for seq, e in log.entries for m in keeping.add(seq, e)]
    assert [m for seq, e in log.entries for m in forgetting.add(seq, e)] == said
    assert sorted(forgetting.state.jobs) == [10, 11, 12]
    assert sum(m.subject.endswith(".submitted") for m in said) == 5


@pytest.mark.timeout(20)
@pytest.mark.parametrize("when", [4.7e18, 1e308, float("inf")], ids=["2^62", "1e308", "inf"])
def test_a_needed_job_at_a_clock_where_an_age_adds_nothing_is_parked_once(when: float) -> None:
    # now + 300 == now here: a needed job put back in the queue at ``now`` was due again at once, and the
    # fold appended to the queue for ever (the scheduler and every replay of the log stood still).
    log = needed_dependee()
    at(log, when, ev.JobCancelRequested(job_id=999_999, user="nobody"))
    tick(log, when)
    assert log.state.parked == {1: [1]} and log.state.jobs[1].state == "FAILED"
    assert len(log.state.ended) - log.state.ended_from == 0


def test_a_poison_entrys_time_forgets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # A handler that raises (a poison entry) stamped a year ahead: its time is taken back, and it must not
    # have forgotten jobs meanwhile, nor parked one until that time (forgetting would stop till then).
    def broken(*args: object) -> fold_module.Outcome:
        raise ValueError("a handler's bug")

    monkeypatch.setitem(fold_module.HANDLERS, ev.JobReasonChanged, broken)
    log = needed_dependee()
    log.add(submitted(3, job(gpus=1, nodes=1)))
    run_to_completion(log, 3)
    end = log.at
    at(log, end + 365 * 86400, ev.JobReasonChanged(job_id=2, attempt=0, reason="Dependency"))
    assert log.state.skipped == 1 and log.state.now == end
    tick(log, end + 1)
    assert sorted(log.state.jobs) == [1, 2, 3] and log.state.parked == {}
    tick(log, end + AGE)
    tick(log, end + AGE + 1)
    assert sorted(log.state.jobs) == [1, 2] and log.state.parked == {1: [1]}


def test_squeue_shows_an_ended_job_for_as_long_as_the_fold_keeps_it() -> None:
    # squeue -j of an ended job answered for a fixed 300 s; with another min_job_age, for that long.
    log = log_forgetting(age=900.0)
    log.add(submitted(1, job(gpus=1, nodes=1)))
    end = run_to_completion(log, 1)
    asked = api.JobsRequest(job_ids=[1])
    policy = policy_of(parse_config(CLUSTER))
    assert [j.job_id for j in jobs_reply(log.state, Plan(), policy, asked, end + 600).jobs] == [1]
    assert jobs_reply(log.state, Plan(), policy, asked, end + 901).jobs == []
