"""No log entry can stall a job or fool the fold about a run (issue 13).

- An entry that fails to decode, or whose body claims another job or node than its subject, changes nothing
  but still moves its job's (or reservation's) sequence (``fold.skip``): the scheduler's next conditional
  append on that job expects it. Before, it left the sequence behind, and every later decision for the job
  lost its append.
- A handler that raises moves the sequence too.
- A run fact from a node the job's current run is not allocated on is ignored (``foreign_node``): an agent's
  role pins the node of its subjects, not the job.
"""

from __future__ import annotations

import pytest
from builders import T0, Log, allocated, cluster, env, job, submitted

from corral.libs.core.fold import apply, skip
from corral.libs.core.state import encode_state
from corral.libs.runtime.ports import decode_entry
from corral.schemas import codec, subjects
from corral.schemas import events as ev


def running_on_gpu01() -> Log:
    """Job 1 running on gpu01 (of two nodes); job 2 pending."""
    log = Log(*cluster(nodes=2))
    log.add(submitted(1), allocated(1, {"gpu01": [0, 1, 2, 3, 4, 5, 6, 7]}), submitted(2))
    return log


#: Bytes on a job's subject that are no event of it.
UNAPPLIABLE = {
    "not json": (subjects.job_subject(2, "job_allocated"), b"\x00garbage"),
    "an empty object": (subjects.job_subject(2, "run_started", "gpu02"), b"{}"),
    "another job's body": (
        subjects.job_subject(2, "job_cancel_requested"),
        codec.encode(env(ev.JobCancelRequested(job_id=1, user="mallory"), at=T0 + 99)),
    ),
}


@pytest.mark.parametrize(("subject", "data"), list(UNAPPLIABLE.values()), ids=list(UNAPPLIABLE))
def test_an_entry_without_an_event_moves_its_jobs_sequence(subject: str, data: bytes) -> None:
    log = running_on_gpu01()
    seq = len(log.entries) + 1
    entry = decode_entry(seq, subject, data)
    assert entry.envelope is None and entry.error
    before = encode_state(log.state)
    outcome = skip(log.state, seq, entry.subject)
    assert outcome.reason == "undecodable"
    assert log.state.jobs[2].last_seq == seq  # the next decision for job 2 expects this entry
    assert log.state.last_seq == seq
    assert log.state.jobs[1].state == "RUNNING" and log.state.jobs[1].cancel_by is None
    assert log.state.skipped == 1
    assert skip(log.state, seq, entry.subject).reason == "replayed"
    assert encode_state(log.state) != before


def test_an_entry_without_an_event_on_a_reservation_moves_its_sequence() -> None:
    log = running_on_gpu01()
    skip(log.state, 9, subjects.resv_subject("maint", "reservation_create_requested"))
    assert log.state.resv_seqs["maint"] == 9


def test_an_entry_elsewhere_moves_only_the_position() -> None:
    log = running_on_gpu01()
    jobs = {job_id: j.last_seq for job_id, j in log.state.jobs.items()}
    skip(log.state, 9, subjects.node_subject("gpu02", "node_down"))
    skip(log.state, 10, "corral.evt.job.notanumber.job_allocated")
    assert {job_id: j.last_seq for job_id, j in log.state.jobs.items()} == jobs
    assert log.state.last_seq == 10


def test_a_job_is_still_allocated_after_an_entry_without_an_event() -> None:
    log = running_on_gpu01()
    seq = len(log.entries) + 1
    skip(log.state, seq, subjects.job_subject(2, "job_allocated"))
    # The scheduler's decision, conditional on the sequence it has: the skipped entry's.
    assert log.state.jobs[2].last_seq == seq
    decision = allocated(2, {"gpu02": [0, 1, 2, 3, 4, 5, 6, 7]})
    assert apply(log.state, seq + 1, env(decision, at=T0 + 50)).applied
    assert log.state.jobs[2].state == "RUNNING"


def test_a_handler_that_raises_still_moves_its_jobs_sequence() -> None:
    log = running_on_gpu01()
    seq = len(log.entries) + 1
    # Billing two GPUs for 1e308 s is infinite: fair_share.charge raises (the poison entry of issue 9).
    outcome = apply(log.state, seq, env(ev.JobCompleted(job_id=1, attempt=0), at=1e308))
    assert outcome.reason == "handler_failed"
    assert log.state.jobs[1].last_seq == seq


def _run_fact(body: ev.Event, seq: int) -> str | None:
    log = running_on_gpu01()
    before = encode_state(log.state)
    outcome = apply(log.state, seq, env(body, at=T0 + 60, actor=f"agent-{getattr(body, 'node', '')}"))
    if not outcome.applied:
        # Nothing of the job or its nodes changed: only the position, clock and the job's sequence.
        job1 = log.state.jobs[1]
        assert (job1.state, job1.run_started, job1.run_exit, job1.exited_nodes) == (
            "RUNNING",
            False,
            None,
            (),
        )
        assert log.state.nodes["gpu01"].used_gpus == list(range(8))
        assert encode_state(log.state) != before
    return outcome.reason


FOREIGN = {
    "a start from another node": ev.RunStarted(job_id=1, attempt=0, node="gpu02", pid=7),
    "an exit from another node": ev.RunExited(job_id=1, attempt=0, node="gpu02", exit_code=0),
    "a start from an unknown node": ev.RunStarted(job_id=1, attempt=0, node="gpu99", pid=7),
}


@pytest.mark.parametrize("body", list(FOREIGN.values()), ids=list(FOREIGN))
def test_a_run_fact_from_a_node_the_run_is_not_on_is_never_applied(body: ev.Event) -> None:
    assert _run_fact(body, 10) == "foreign_node"


def test_a_run_fact_from_the_runs_node_is_applied() -> None:
    assert _run_fact(ev.RunStarted(job_id=1, attempt=0, node="gpu01", pid=7), 10) is None


def test_a_start_from_a_peer_node_of_the_run_is_not_the_batch_nodes() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=2)), allocated(1, {"gpu01": [0], "gpu02": [0]}))
    outcome = apply(log.state, 10, env(ev.RunStarted(job_id=1, attempt=0, node="gpu02", pid=7), at=T0 + 60))
    assert outcome.reason == "not_batch_node"
