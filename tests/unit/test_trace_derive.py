"""A job's spans derived from its entries: hand-built logs for each phase, and random logs folded by the same
lifecycle (the derivation agrees with the fold, and a span once ended never changes as the log grows)."""

from __future__ import annotations

import pytest
from builders import allocated, exited, job
from hypothesis import given, settings
from hypothesis import strategies as st
from random_logs import NODES, logs, registered

from corral.libs.core import fold
from corral.libs.core.fold_runs import live_run
from corral.libs.core.state import State
from corral.libs.trace import coverage, derive
from corral.libs.trace.spans import SpanRecord, span_id_for
from corral.schemas import codec
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Entries:
    """A hand-built log: each event one second after the previous one, with its own event id."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, ev.Envelope]] = []

    def add(self, body: ev.Event, *, traceparent: str | None = None, causation_id: str | None = None) -> str:
        seq = len(self.entries) + 1
        envelope = codec.envelope(
            body,
            actor="test",
            occurred_at=T0 + seq,
            event_id=f"e{seq}",
            traceparent=traceparent,
            causation_id=causation_id,
        )
        self.entries.append((seq, envelope))
        return envelope.meta.event_id

    def spans(self, job_id: int = 1) -> dict[str, SpanRecord]:
        found = derive.spans(job_id, self.entries)
        by_name = {_key(s): s for s in found}
        assert len(by_name) == len(found), [s.name for s in found]
        return by_name


def _key(span: SpanRecord) -> str:
    """A span's name, with `` @k`` for the spans of a node or step in attempt k > 0."""
    attempt = span.attributes.get("corral.attempt", 0) if span.kind in ("launch", "run", "step") else 0
    return f"{span.name} @{attempt}" if attempt else span.name


def submit(log: Entries, job_id: int = 1, spec: ev.JobSpec | None = None, **meta: str) -> None:
    log.add(ev.JobSubmitted(job_id=job_id, user="alice", spec=spec or job(gpus=2, nodes=1)), **meta)


def started(job_id: int, node: str, attempt: int = 0) -> ev.RunStarted:
    return ev.RunStarted(job_id=job_id, attempt=attempt, node=node, pid=4242)


def tree(spans: dict[str, SpanRecord]) -> dict[str, str | None]:
    """Each span's parent's name."""
    names = {s.span_id: key for key, s in spans.items()}
    return {key: names.get(s.parent_id or "") for key, s in spans.items()}


def test_every_event_type_becomes_span_data_or_is_ignored_with_a_reason() -> None:
    assert not coverage.HANDLED & set(coverage.IGNORED)
    assert coverage.HANDLED | set(coverage.IGNORED) == set(ev.EVENT_TYPES)


def test_a_one_node_job_continues_the_submitters_trace() -> None:
    log = Entries()
    submit(log, spec=job(gpus=2, nodes=1, qos="normal", account="ml", gpu_type="h100"), traceparent=CALLER)
    log.add(allocated(1, {"n1": [2, 3]}))
    log.add(started(1, "n1"))
    log.add(exited(1, "n1"))
    log.add(ev.JobCompleted(job_id=1, attempt=0))
    spans = log.spans()
    assert tree(spans) == {
        "submit": None,
        "job 1": "submit",
        "queued": "job 1",
        "attempt 0": "job 1",
        "launch n1": "attempt 0",
        "run n1": "attempt 0",
        "conclude": "job 1",
    }
    assert {s.trace_id for s in spans.values()} == {"0af7651916cd43dd8448eb211c80319c"}
    assert spans["submit"].span_id == "b7ad6b7169203331"
    assert spans["submit"].exporter == "gateway"
    assert {s.exporter for n, s in spans.items() if n != "submit"} == {"tracer"}
    root = spans["job 1"]
    assert root.attributes == {
        "corral.job.id": 1,
        "corral.job.name": "train",
        "enduser.id": "alice",
        "corral.account": "ml",
        "corral.partition": "gpu",
        "corral.qos": "normal",
        "corral.job.node_count": 1,
        "corral.gpu.count": 2,
        "corral.gpu.type": "h100",
        "corral.wait_s": 1.0,
        "corral.nodes": ["n1"],
        "corral.job.state": "COMPLETED",
        "corral.job.restart_count": 0,
    }
    assert (root.start_ns, root.end_ns, root.status, root.end_seq) == (
        int((T0 + 1) * 1e9),
        int((T0 + 5) * 1e9),
        "ok",
        5,
    )
    assert spans["queued"].end_seq == 2 and spans["launch n1"].end_seq == 3
    run = spans["run n1"]
    assert run.attributes["corral.gpu.indices"] == [2, 3] and run.attributes["process.pid"] == 4242
    assert (run.attributes["process.exit.code"], run.end_seq) == (0, 4)
    assert (spans["conclude"].start_ns, spans["conclude"].end_ns) == (run.end_ns, root.end_ns)
    # Deriving again gives the same spans, ids included; the ids are the documented hash.
    assert derive.spans(1, list(reversed(log.entries))) == list(log.spans().values())
    trace = root.trace_id
    assert spans["attempt 0"].span_id == span_id_for(trace, 1, 0, "", "attempt")
    assert spans["run n1"].span_id == span_id_for(trace, 1, 0, "n1", "run")


def test_without_a_traceparent_the_trace_id_comes_from_the_job_and_its_submission() -> None:
    log = Entries()
    submit(log)
    spans = log.spans()
    assert spans["submit"].exporter == "tracer" and spans["submit"].end_seq == 1
    assert spans["job 1"].end_ns is None and spans["queued"].end_ns is None
    other = Entries()
    other.add(ev.NodeUp(node="n1"))  # the same job with another submission event id: another trace
    submit(other)
    assert other.spans()["job 1"].trace_id != spans["job 1"].trace_id


def test_a_two_node_gpu_job_has_a_launch_and_a_run_span_per_node() -> None:
    log = Entries()
    submit(log, spec=job(gpus=2, nodes=2))
    log.add(allocated(1, {"n1": [0, 1], "n2": [2, 3]}))
    log.add(started(1, "n1"))
    log.add(exited(1, "n1", exit_code=3))
    log.add(ev.JobFailed(job_id=1, attempt=0, reason="NonZeroExitCode", exit_code=3))
    spans = log.spans()
    for node, gpus, role in (("n1", [0, 1], "batch"), ("n2", [2, 3], "peer")):
        for kind in ("launch", "run"):
            span = spans[f"{kind} {node}"]
            assert span.attributes["host.name"] == node
            assert span.attributes["corral.gpu.indices"] == gpus
            assert span.attributes["corral.node.role"] == role
    assert spans["run n1"].status == "error" and spans["run n1"].attributes["process.exit.code"] == 3
    # The peer's run ends with the attempt: it reported nothing of its own.
    assert spans["run n2"].end_seq == 5 and spans["run n2"].status == "unset"
    assert spans["job 1"].attributes["corral.gpu.count"] == 4
    assert spans["job 1"].attributes["corral.job.state"] == "FAILED"
    assert (spans["attempt 0"].status, spans["attempt 0"].status_message) == ("error", "NonZeroExitCode")


@pytest.mark.parametrize("named", [False, True], ids=["found-in-the-log", "causation-id"])
def test_a_node_failure_requeue_names_the_node_down_and_starts_a_second_attempt(named: bool) -> None:
    log = Entries()
    submit(log, spec=job(gpus=1, nodes=2))
    log.add(allocated(1, {"n1": [0], "n2": [0]}))
    log.add(started(1, "n1"))
    down = log.add(ev.NodeDown(node="n2", reason="Not responding"))
    log.add(ev.NodeDown(node="n3", reason="elsewhere"))  # another node's: never the cause
    log.add(ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"), causation_id=down if named else None)
    log.add(exited(1, "n1", killed=True, signal=15))  # the old run's late exit changes nothing
    log.add(allocated(1, {"n1": [0], "n2": [0]}, attempt=1))
    log.add(started(1, "n1", attempt=1))
    log.add(exited(1, "n1", attempt=1))
    log.add(ev.JobCompleted(job_id=1, attempt=1))
    spans = log.spans()
    assert {"attempt 0", "attempt 1", "queued", "queued 1", "run n2"} <= spans.keys()
    first = spans["attempt 0"]
    [attrs] = [e.attributes for e in first.events if e.name == "requeued"]
    assert attrs["corral.requeue.reason"] == "NodeFail"
    assert attrs["corral.cause"] == "NodeDown" and attrs["corral.cause.node"] == "n2"
    assert attrs["corral.cause.reason"] == "Not responding" and attrs["corral.cause.event_id"] == down
    assert [e.name for e in first.events] == ["node_down", "requeued"]
    # Attempt 0's spans on both nodes end by the requeue at the latest; the run on n2 when n2 went down.
    assert spans["run n2"].status == "error" and spans["run n2"].end_seq == 4
    assert spans["run n1"].end_seq == 6 and "process.exit.code" not in spans["run n1"].attributes
    assert spans["queued 1"].start_ns == first.end_ns and spans["queued 1"].end_seq == 8
    assert spans["job 1"].attributes["corral.job.restart_count"] == 1
    assert len({s.span_id for s in spans.values()}) == len(spans)


def test_a_preempted_run_names_its_preemptor_and_a_cancel_its_user() -> None:
    log = Entries()
    submit(log)
    log.add(allocated(1, {"n1": [0, 1]}))
    log.add(started(1, "n1"))
    log.add(ev.JobPreempted(job_id=1, attempt=0, mode="requeue", by_job=9, grace_s=3))
    log.add(exited(1, "n1", killed=True, signal=9))
    log.add(ev.JobRequeued(job_id=1, attempt=0, reason="Preempted"))
    log.add(ev.JobCancelRequested(job_id=1, user="bob"))
    log.add(ev.JobCancelled(job_id=1, attempt=-1, by="bob"))
    spans = log.spans()
    events = {e.name: e.attributes for e in spans["attempt 0"].events}
    assert events["preempted"]["corral.preempt.by_job"] == 9
    assert events["requeued"]["corral.cause"] == "JobPreempted"
    assert events["requeued"]["corral.preempt.by_job"] == 9
    queued = spans["queued 1"]
    assert [(e.name, e.attributes) for e in queued.events] == [("cancel_requested", {"corral.by": "bob"})]
    conclude = spans["conclude"]
    assert conclude.attributes["corral.cancelled_by"] == "bob"
    assert conclude.attributes["corral.cause.user"] == "bob"
    assert conclude.start_ns == queued.events[0].time_ns and queued.end_seq == 8


def test_a_time_limit_is_an_event_and_the_failure_names_it() -> None:
    log = Entries()
    submit(log)
    log.add(allocated(1, {"n1": [0]}, time_s=60))
    log.add(started(1, "n1"))
    log.add(exited(1, "n1", signal=15, killed=True, timed_out=True))
    log.add(ev.JobFailed(job_id=1, attempt=0, reason="TimeLimit", signal=15))
    spans = log.spans()
    [limit] = [e for e in spans["attempt 0"].events if e.name == "time_limit"]
    assert limit.attributes == {"corral.time_limit_s": 60, "host.name": "n1"}
    assert spans["conclude"].attributes["corral.cause"] == "RunExited"
    assert spans["job 1"].attributes["corral.job.state"] == "TIMEOUT"


def test_holds_are_the_pending_reasons_the_log_knows() -> None:
    log = Entries()
    submit(log, spec=job(gpus=1, nodes=1, held=True))
    log.add(ev.JobReleased(job_id=1, by="alice"))
    log.add(ev.JobHeld(job_id=1, by="root", admin=True))
    queued = log.spans()["queued"]
    reasons = [e.attributes["corral.pending.reason"] for e in queued.events]
    assert reasons == ["JobHeldUser", "Released", "JobHeldAdmin"]


def test_each_logged_reason_change_is_a_pending_reason_event_of_its_queued_span() -> None:
    log = Entries()
    submit(log)
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=0, reason="Priority"))
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=0, reason="Resources"))
    log.add(
        ev.JobReasonChanged(
            job_id=ev.JobId(1), attempt=0, reason="ReqNodeNotAvail", detail="UnavailableNodes:n2"
        )
    )
    log.add(allocated(1, {"n1": [0, 1]}))
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=0, reason="Priority"))  # late: not pending
    log.add(ev.RunExited(job_id=1, attempt=0, node="n1", exit_code=0, signal=9))
    log.add(ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"))
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=0, reason="Dependency"))  # the old attempt's
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=1, reason="Resources"))
    spans = log.spans()
    first = [(e.name, e.time_ns, e.attributes) for e in spans["queued"].events]
    assert first == [
        ("pending_reason", int((T0 + 2) * 1e9), {"corral.pending.reason": "Priority"}),
        ("pending_reason", int((T0 + 3) * 1e9), {"corral.pending.reason": "Resources"}),
        (
            "pending_reason",
            int((T0 + 4) * 1e9),
            {"corral.pending.reason": "ReqNodeNotAvail", "corral.pending.detail": "UnavailableNodes:n2"},
        ),
    ]
    assert [e.name for e in spans["attempt 0"].events] == ["requeued"]
    again = spans["queued 1"].events
    assert [e.attributes["corral.pending.reason"] for e in again] == ["Resources"]


def test_a_logged_reason_the_queued_span_shows_already_adds_no_event() -> None:
    log = Entries()
    submit(log, spec=job(gpus=1, nodes=1, held=True))
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=0, reason="JobHeldUser"))  # the scheduler's view
    log.add(ev.JobReleased(job_id=1, by="alice"))
    log.add(ev.JobReasonChanged(job_id=ev.JobId(1), attempt=0, reason="Resources"))
    reasons = [e.attributes["corral.pending.reason"] for e in log.spans()["queued"].events]
    assert reasons == ["JobHeldUser", "Released", "Resources"]


def test_an_srun_step_over_two_nodes_is_a_child_of_the_batch_run() -> None:
    log = Entries()
    submit(log, spec=job(gpus=1, nodes=2))
    log.add(allocated(1, {"n1": [0], "n2": [0]}))
    log.add(started(1, "n1"))
    step = dict(job_id=1, attempt=0, step_id=0, node="n1")
    log.add(ev.StepStarted(**step, name="hostname", nodes=["n1", "n2"], ntasks=2))  # type: ignore[arg-type]
    log.add(ev.StepExited(**step, exit_code=0))  # type: ignore[arg-type]
    spans = log.spans()
    span = spans["step 1.0 hostname"]
    assert tree(spans)["step 1.0 hostname"] == "run n1"
    assert span.attributes["corral.step.nodes"] == ["n1", "n2"] and span.attributes["corral.step.ntasks"] == 2
    assert span.end_seq == 5 and span.attributes["process.exit.code"] == 0


def test_an_array_task_shares_the_arrays_submit_span_and_names_its_index() -> None:
    log = Entries()
    array = ev.ArraySpec(ranges=[ev.ArrayRange(start=4, end=8, step=2)])
    submit(log, job_id=5, spec=job(gpus=1, nodes=1, array=array), traceparent=CALLER)
    log.add(allocated(7, {"n1": [0]}))
    task = log.spans(7)
    assert task["job 7"].attributes["corral.array.job_id"] == 5
    assert task["job 7"].attributes["corral.array.task_id"] == 8
    assert task["attempt 0"].end_ns is None
    first = log.spans(5)
    assert first["submit"] == task["submit"] and first["job 5"].attributes["corral.array.task_id"] == 4
    assert first["job 5"].span_id != task["job 7"].span_id
    assert log.spans(8) == {}


def _applied(entries: list[tuple[int, ev.Envelope]]) -> list[tuple[int, ev.Envelope]]:
    """The entries the fold applies (step facts: those about a job's live run), as accounting records."""
    state, kept = State(), []
    for seq, envelope in entries:
        body = envelope.body
        counts = (
            live_run(state, body.job_id, body.attempt)
            if isinstance(body, ev.StepStarted | ev.StepExited)
            else None
        )
        outcome = fold.apply(state, seq, envelope)
        if outcome.applied or counts:
            kept.append((seq, envelope))
    return kept


@st.composite
def _run(draw: st.DrawFn, job_id: int, attempt: int) -> list[ev.Event]:
    """One attempt of a job as the services write it, ending in a requeue or a conclusion (or still open),
    with the facts an agent may report late or twice."""
    nodes = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=2, unique=True))
    out: list[ev.Event] = [allocated(job_id, {n: [job_id % 2] for n in nodes}, attempt=attempt)]
    if draw(st.booleans()):
        out.append(ev.RunStarted(job_id=job_id, attempt=attempt, node=nodes[0], pid=1))
        if draw(st.booleans()):
            out.append(
                ev.StepStarted(
                    job_id=job_id, attempt=attempt, step_id=0, node=nodes[0], name="s", nodes=nodes, ntasks=2
                )
            )
            code = draw(st.sampled_from([0, 1]))
            # with each task's outcome (a peer's lost: no times), or as an entry from before tasks were kept
            tasks = [ev.TaskOutcome(rank=r, node=n, pid=r + 1, exit_code=code) for r, n in enumerate(nodes)]
            tasks = draw(
                st.sampled_from([[], tasks, [*tasks[:1], ev.TaskOutcome(rank=1, node="x", signal=9)]])
            )
            out.append(
                ev.StepExited(
                    job_id=job_id, attempt=attempt, step_id=0, node=nodes[0], exit_code=code, tasks=tasks
                )
            )
    end = draw(st.sampled_from(["requeue", "node", "preempt", "complete", "fail", "cancel", "open"]))
    if end == "node":
        out.append(ev.NodeDown(node=nodes[-1], reason="Not responding"))
        out.append(ev.JobRequeued(job_id=job_id, attempt=attempt, reason="NodeFail"))
        out.append(ev.NodeUp(node=nodes[-1]))
    elif end == "preempt":
        out.append(ev.JobPreempted(job_id=job_id, attempt=attempt, mode="requeue", by_job=9))
        out.append(exited(job_id, nodes[0], attempt=attempt, killed=True, signal=9))
        out.append(ev.JobRequeued(job_id=job_id, attempt=attempt, reason="Preempted"))
    elif end == "requeue":
        out.append(ev.JobRequeueRequested(job_id=job_id, user="alice"))
        out.append(ev.JobRequeued(job_id=job_id, attempt=attempt, reason="Requested"))
    elif end == "complete":
        out.append(exited(job_id, nodes[0], attempt=attempt))
        out.append(ev.JobCompleted(job_id=job_id, attempt=attempt))
    elif end == "fail":
        out.append(exited(job_id, nodes[0], attempt=attempt, exit_code=2))
        out.append(ev.JobFailed(job_id=job_id, attempt=attempt, reason="NonZeroExitCode", exit_code=2))
    elif end == "cancel":
        out.append(ev.JobCancelRequested(job_id=job_id, user="bob"))
        out.append(ev.JobCancelled(job_id=job_id, attempt=attempt, by="bob"))
    if draw(st.booleans()):
        out.append(exited(job_id, nodes[-1], attempt=attempt, killed=True))  # late, or a peer's
    return out


@st.composite
def lifecycles(draw: st.DrawFn) -> list[tuple[int, ev.Envelope]]:
    """Logs of three jobs that each go through up to three attempts, interleaved at random."""
    streams: list[list[ev.Event]] = []
    for job_id in (1, 2, 3):
        held = draw(st.booleans())
        spec = job(gpus=1, nodes=2, held=held)
        stream: list[ev.Event] = [ev.JobSubmitted(job_id=job_id, user="alice", spec=spec)]
        if held:
            stream.append(ev.JobReleased(job_id=job_id, by="alice"))
        for attempt in range(draw(st.integers(0, 3))):
            stream += draw(_run(job_id, attempt))
        streams.append(stream)
    bodies: list[ev.Event] = [registered(n) for n in NODES]
    while any(streams):
        stream = draw(st.sampled_from([s for s in streams if s]))
        bodies.append(stream.pop(0))
    return [
        (seq, codec.envelope(body, actor="test", occurred_at=T0 + seq, event_id=f"e{seq}"))
        for seq, body in enumerate(bodies, start=1)
    ]


@settings(max_examples=150, deadline=None)
@given(st.one_of(logs(), lifecycles()))
def test_derived_spans_follow_the_fold_and_never_change_once_ended(
    entries: list[tuple[int, ev.Envelope]],
) -> None:
    applied = _applied(entries)
    state = State()
    for seq, envelope in entries:
        fold.apply(state, seq, envelope)
    for job_id, folded in state.jobs.items():
        spans = derive.spans(job_id, applied)
        ids = {s.span_id for s in spans}
        assert len(ids) == len(spans)
        assert all(s.parent_id in ids for s in spans if s.kind != "submit")
        kinds = {s.span_id: s.kind for s in spans}
        assert all(kinds[s.parent_id or ""] == "step" for s in spans if s.kind == "task")
        assert all(s.end_ns is None or s.end_ns >= s.start_ns for s in spans)
        allocations = [
            e for _, e in applied if isinstance(e.body, ev.JobAllocated) and e.body.job_id == job_id
        ]
        assert len([s for s in spans if s.kind == "attempt"]) == len(allocations)
        [root] = [s for s in spans if s.kind == "job"]
        terminal = folded.state not in ("PENDING", "RUNNING")
        assert (root.end_ns is not None) == terminal
        if terminal:
            assert root.attributes["corral.job.state"] == folded.state
            assert root.attributes["corral.job.restart_count"] == folded.restart_count
        # What the tracer exports as the log grows: a span ended at a prefix is the same span at the end.
        final = {s.span_id: s for s in spans}
        for cut in range(1, len(applied)):
            for span in derive.spans(job_id, applied[:cut]):
                if span.end_ns is not None:
                    assert final[span.span_id] == span
