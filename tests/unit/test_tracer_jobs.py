"""The tracer's memory: each span comes out once, when the entry that ends it is filed, equal to the span
derived from the whole log; a redelivery ends nothing, and a failed export's rollback gives the same spans."""

from __future__ import annotations

import pytest
from builders import allocated, exited, job

from corral.libs.trace import derive
from corral.schemas import codec
from corral.schemas import events as ev
from corral.services.tracer.jobs import Jobs

pytestmark = pytest.mark.unit

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _log() -> list[tuple[int, ev.Envelope]]:
    array = ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=1)])
    bodies: list[ev.Event] = [
        ev.JobSubmitted(job_id=1, user="alice", spec=job(gpus=1, nodes=2)),
        ev.JobSubmitted(job_id=2, user="bob", spec=job(gpus=1, nodes=1, array=array)),
        allocated(1, {"n1": [0], "n2": [0]}),
        ev.RunStarted(job_id=1, attempt=0, node="n1", pid=7),
        ev.NodeDown(node="n2", reason="Not responding"),
        ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"),
        allocated(3, {"n1": [1]}),
        ev.JobCancelRequested(job_id=2, user="bob", whole_array=True),
        ev.JobCancelled(job_id=2, attempt=-1, by="bob"),
        exited(3, "n1", killed=True, signal=15),
        ev.JobCancelled(job_id=3, attempt=0, by="bob"),
        allocated(1, {"n1": [0], "n2": [0]}, attempt=1),
        ev.RunStarted(job_id=1, attempt=1, node="n1", pid=8),
        exited(1, "n1", attempt=1),
        ev.JobCompleted(job_id=1, attempt=1),
        exited(1, "n2", attempt=1),  # a late fact of a finished job
    ]
    return [
        (
            seq,
            codec.envelope(b, actor="t", occurred_at=1e9 + seq, event_id=f"e{seq}", traceparent=TRACEPARENT),
        )
        for seq, b in enumerate(bodies, start=1)
    ]


def test_each_span_comes_out_once_when_its_end_is_filed() -> None:
    log, jobs = _log(), Jobs()
    out = []
    for seq, envelope in log:
        for span in jobs.add(seq, envelope):
            assert span.end_seq == seq
            out.append(span)
        jobs.commit()
    expected = [
        s for j in (1, 2, 3) for s in derive.spans(j, log) if s.exporter == "tracer" and s.end_ns is not None
    ]
    assert sorted(out, key=lambda s: s.span_id) == sorted(expected, key=lambda s: s.span_id)
    assert len({s.span_id for s in out}) == len(out)
    # The gateway exports the submit spans (the entries carry its traceparent); every job is finished.
    assert "submit" not in {s.kind for s in out} and jobs.entries == {} and jobs.arrays == {}
    assert jobs.add(3, log[2][1]) == []  # redelivered


def test_a_rollback_files_the_batch_again_with_the_same_spans() -> None:
    log, jobs = _log(), Jobs()
    for seq, envelope in log[:13]:
        jobs.add(seq, envelope)
    jobs.commit()
    batch = [span for seq, envelope in log[13:] for span in jobs.add(seq, envelope)]
    assert {s.kind for s in batch} >= {"run", "attempt", "job", "conclude"}
    jobs.rollback(13)
    again = [span for seq, envelope in log[13:] for span in jobs.add(seq, envelope)]
    assert again == batch


@pytest.mark.parametrize("size", [1, 2, 3, 5, 16])
def test_a_batch_derives_each_job_once_and_gives_the_spans_entry_by_entry_gives(size: int) -> None:
    log = _log()
    one_by_one, batched = Jobs(), Jobs()
    single = [span for seq, envelope in log for span in one_by_one.add(seq, envelope)]
    out = []
    for start in range(0, len(log), size):
        for seq, envelope in log[start : start + size]:
            batched.file(seq, envelope)
        spans = batched.take()
        assert all(start < s.end_seq <= start + size for s in spans)
        out += spans
        batched.commit()
    assert sorted(out, key=lambda s: s.span_id) == sorted(single, key=lambda s: s.span_id)
    assert batched.entries == {} and batched.take() == []


def test_a_deposed_leaders_decisions_end_no_span_as_the_fold_ignores_them() -> None:
    # Job 2's allocation by the new leader (epoch 2) raises the epoch; the deposed leader (epoch 1) then
    # starts and concludes job 1: the fold ignores both, and so does job 1's trace.
    bodies: list[ev.Event] = [
        ev.JobSubmitted(job_id=1, user="alice", spec=job(gpus=1, nodes=1)),
        ev.JobSubmitted(job_id=2, user="alice", spec=job(gpus=1, nodes=1)),
        allocated(2, {"n1": [0]}, epoch=2),
        allocated(1, {"n1": [1]}, epoch=1),
        ev.RunStarted(job_id=1, attempt=0, node="n1", pid=7),
        exited(1, "n1"),
        ev.JobCompleted(job_id=1, attempt=0, epoch=1),
    ]
    log = [
        (seq, codec.envelope(b, actor="t", occurred_at=1e9 + seq, event_id=f"e{seq}"))
        for seq, b in enumerate(bodies, start=1)
    ]
    jobs = Jobs()
    ended = [span for seq, envelope in log for span in jobs.add(seq, envelope)]
    job_1 = derive.spans(1, log[:1])[0].trace_id
    assert [s.kind for s in ended if s.trace_id == job_1] == ["submit"]  # the job is still queued
    assert jobs.epoch == 2 and [seq for seq, _ in jobs.raises] == [3]
    # Job 1's own entries alone do not know the epoch was raised: the derivation needs the raise.
    assert {s.kind for s in derive.spans(1, log[:2] + log[3:])} >= {"attempt", "job"}
    assert "attempt" not in {s.kind for s in derive.spans(1, log)}
