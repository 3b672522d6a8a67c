"""A job's spans, derived from its log entries: a pure function, the same ids every time.

``spans(job_id, entries)`` takes the log entries (``(seq, envelope)``, any order, unrelated ones allowed)
that concern one job: its own (the submission of its array for an array task), its step facts, and the
node events of the nodes it ran on (``NodeRegistered`` for their GPU type, ``NodeDown`` for the causes
of requeues). It returns the job's span tree:

    submit (the gateway's live span: its id is the job's traceparent)
    └── job <id>                       submit → conclusion
        ├── queued [attempt k]         submit or requeue → allocation; span events: pending_reason
        │                              (each change, a hold, a release), job_updated
        ├── attempt k                  allocation → requeue or conclusion; span events: preempted,
        │   │                          cancel/requeue/signal requested, node_down, time_limit, requeued
        │   ├── launch <node>          allocation → RunStarted of the batch node
        │   └── run <node>             RunStarted → RunExited (exit code, signal, OOM)
        │       └── step <job>.<n>     StepStarted → StepExited (batch node's run)
        └── conclude                   the last run's exit (or the cancel request) → the conclusion

The entries are followed along the job state machine of ``schemas.lifecycle``: an event counts only in
the states its transition or mark lists and for the current attempt (a late fact of an earlier run changes
nothing), as the fold does. Every event type is handled or listed in ``IGNORED`` with why
(``tests/unit/test_trace_derive.py`` checks it). The queued span's ``pending_reason`` events say why
the job waited: each ``JobReasonChanged`` the scheduler logged (Resources, Priority, Dependency, a QOS
limit, ReqNodeNotAvail with its nodes ...; ``corral.pending.reason`` and ``corral.pending.detail``), holds
(JobHeldUser / JobHeldAdmin) and releases; a logged reason equal to the one the span shows already (a hold
the scheduler then logs as JobHeldUser) adds no second event.

Peer nodes report no start of their own (the batch node's agent starts the script; a peer works only in
steps), so a peer's launch and run spans take the batch node's RunStarted; a peer's run ends at its own
``RunExited`` (its processes gone, after a kill) or at the end of the attempt.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.libs.trace.causes import Causes
from corral.libs.trace.spans import (
    AttrValue,
    Exporter,
    SpanEvent,
    SpanKind,
    SpanRecord,
    Status,
    ns,
    parse_traceparent,
    span_id_for,
    trace_id_for,
)
from corral.schemas import events as ev
from corral.schemas import lifecycle
from corral.schemas.lifecycle import JobState

#: Event types the derivation does not turn into span data, and why.
IGNORED: dict[type[ev.Event], str] = {
    ev.JobHoldRequested: "an intent: the JobHeld decision is the pending reason's change",
    ev.JobReleaseRequested: "an intent: JobReleased is the change",
    ev.JobUpdateRequested: "an intent: JobUpdated is the change",
    ev.NodeUp: "node facts count only as causes (NodeDown)",
    ev.NodeDrained: "a drain ends no run",
    ev.NodeResumed: "a drain ends no run",
    ev.NodeDrainRequested: "an intent",
    ev.NodeResumeRequested: "an intent",
    ev.NodeDownRequested: "an intent: health's NodeDown is the fact",
    ev.ReservationCreateRequested: "not about a job",
    ev.ReservationDeleteRequested: "not about a job",
    ev.ReservationCreated: "not about a job",
    ev.ReservationRejected: "not about a job",
    ev.ReservationDeleted: "not about a job",
}

_CONCLUSIONS = (ev.JobCompleted, ev.JobFailed, ev.JobCancelled)

#: Event types that become span data: spans' starts and ends, span events, causes.
HANDLED: frozenset[type[ev.Event]] = frozenset(
    {
        ev.JobSubmitted,
        ev.JobAllocated,
        ev.RunStarted,
        ev.RunExited,
        ev.StepStarted,
        ev.StepExited,
        ev.NodeDown,
        ev.NodeRegistered,
        ev.JobRequeued,
        *_CONCLUSIONS,
        ev.JobHeld,
        ev.JobReleased,
        ev.JobUpdated,
        ev.JobReasonChanged,
        ev.JobCancelRequested,
        ev.JobPreempted,
        ev.JobRequeueRequested,
        ev.JobSignalRequested,
    }
)


@dataclass
class _Span:
    """A span being built."""

    name: str
    kind: SpanKind
    span_id: str
    parent_id: str | None
    start_ns: int
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    end_ns: int | None = None
    end_seq: int = 0
    status: Status = "unset"
    status_message: str = ""

    def end(self, seq: int, at_ns: int, status: Status = "unset", message: str = "") -> None:
        if self.end_ns is not None:
            return
        self.end_ns, self.end_seq = max(at_ns, self.start_ns), seq
        if status != "unset":
            self.status, self.status_message = status, message

    def event(self, name: str, at_ns: int, attributes: dict[str, AttrValue]) -> None:
        self.events.append(SpanEvent(name=name, time_ns=at_ns, attributes=attributes))


class _Derivation:
    """The job's spans as its entries come, in log order."""

    def __init__(self, job_id: int, entries: list[tuple[int, ev.Envelope]]) -> None:
        self.job_id = job_id
        self.causes = Causes(entries)
        self.state: JobState | None = None
        self.attempt = 0  # the current (or next) attempt: the job's restart count
        self.trace_id = ""
        self.exporter: str = "tracer"
        self.spans: list[_Span] = []
        self.job: _Span | None = None
        self.queued: _Span | None = None
        self.current: _Span | None = None  # the current attempt's span
        self.children: dict[tuple[str, str], _Span] = {}  # (kind, node or step) -> open span of the attempt
        self.nodes: list[ev.NodeAllocation] = []  # the current attempt's allocation
        self.run_exit: tuple[int, float] | None = None  # (seq, time) of the batch node's exit, this attempt
        self.cancel_at: float | None = None  # when a cancel was requested
        self.gpu_type = ""  # the GPU type the job asked for ("" = any)
        self.gpu_types: dict[str, str] = {}  # node -> its GPUs' type, as it last registered
        self.array_id = 0  # the submission's job id (an array's first task)
        self.attempt_seq = 0  # log position of the current attempt's allocation
        self.shown_reason: tuple[str, str] | None = None  # the queued span's newest pending reason, detail

    # spans -------------------------------------------------------------------------------------------
    def _open(
        self,
        kind: SpanKind,
        name: str,
        parent: _Span | None,
        at: float,
        attempt: int | None = None,
        node: str = "",
        attributes: dict[str, AttrValue] | None = None,
    ) -> _Span:
        span = _Span(
            name=name,
            kind=kind,
            span_id=span_id_for(self.trace_id, self.job_id, attempt, node, kind),
            parent_id=parent.span_id if parent else None,
            start_ns=ns(at),
            attributes={k: v for k, v in (attributes or {}).items() if v != ""},
        )
        self.spans.append(span)
        return span

    def _close_children(self, seq: int, at: float) -> None:
        for span in self.children.values():
            span.end(seq, ns(at))
        self.children = {}

    # entries -----------------------------------------------------------------------------------------
    def apply(self, seq: int, env: ev.Envelope) -> None:
        body, at = env.body, env.meta.occurred_at
        if isinstance(body, ev.NodeRegistered):
            self.gpu_types[body.node] = body.gpu_type or ""
            return
        if isinstance(body, ev.JobSubmitted):
            self._submitted(seq, env, body)
            return
        if self.job is None or not self._counts(body):
            return
        if isinstance(body, ev.JobAllocated):
            self._allocated(seq, at, body)
        elif isinstance(body, ev.RunStarted):
            self._run_started(seq, at, body)
        elif isinstance(body, ev.RunExited):
            self._run_exited(seq, at, body)
        elif isinstance(body, ev.StepStarted | ev.StepExited):
            self._step(seq, at, body)
        elif isinstance(body, ev.NodeDown):
            self._node_down(seq, at, body)
        elif isinstance(body, ev.JobRequeued):
            self._requeued(seq, env, body)
        elif isinstance(body, _CONCLUSIONS):
            self._concluded(seq, env, body)
        else:
            self._marked(at, body)

    def _counts(self, body: ev.Event) -> bool:
        """Whether the event is about this job's current state and attempt (the lifecycle's rule)."""
        if isinstance(body, ev.NodeDown):
            return self.state == "RUNNING" and any(a.node == body.node for a in self.nodes)
        if isinstance(body, ev.StepStarted | ev.StepExited):
            return body.job_id == self.job_id and self.state == "RUNNING" and body.attempt == self.attempt
        if type(body) in IGNORED:
            return False
        job_id = getattr(body, "job_id", None)
        whole = isinstance(body, ev.JobCancelRequested) and body.whole_array
        if job_id != self.job_id and not (whole and job_id == self.array_id):
            return False
        transition = lifecycle.JOB_TRANSITION_OF.get(type(body))
        if transition is not None:
            attempt = getattr(body, "attempt", None)
            current = attempt == self.attempt or (
                transition.attempt == "current_or_pending" and attempt == -1 and self.state == "PENDING"
            )
            return self.state in transition.sources and current
        mark = lifecycle.JOB_MARK_OF[type(body)]
        attempt = getattr(body, "attempt", self.attempt)
        return self.state in mark.states and attempt == self.attempt

    def _submitted(self, seq: int, env: ev.Envelope, body: ev.JobSubmitted) -> None:
        if self.job is not None:
            return
        index = self._array_index(body)
        if index is False:
            return
        self.array_id = body.job_id
        at, spec = env.meta.occurred_at, body.spec
        given = parse_traceparent(env.meta.traceparent)
        if given is not None:
            self.trace_id, submit_id = given
            self.exporter = "gateway"
        else:
            self.trace_id = trace_id_for(body.job_id, env.meta.event_id)
            submit_id = span_id_for(self.trace_id, body.job_id, None, "", "submit")
        submit = _Span(
            name="submit",
            kind="submit",
            span_id=submit_id,
            parent_id=None,
            start_ns=ns(at),
            attributes={"corral.job.id": body.job_id, "enduser.id": body.user},
        )
        submit.end(seq, ns(at))
        self.spans.append(submit)
        self.gpu_type = spec.gpu_type or ""
        attributes: dict[str, AttrValue] = {
            "corral.job.id": self.job_id,
            "corral.job.name": spec.name,
            "enduser.id": body.user,
            "corral.account": spec.account or "",
            "corral.partition": spec.partition or "",
            "corral.qos": spec.qos or "",
            "corral.job.node_count": spec.nodes,
            "corral.gpu.count": spec.gpus_per_node * spec.nodes,
            "corral.gpu.type": self.gpu_type,
        }
        if index is not None:
            attributes |= {"corral.array.job_id": body.job_id, "corral.array.task_id": index}
        self.job = self._open("job", f"job {self.job_id}", submit, at, attributes=attributes)
        self.queued = self._open("queued", "queued", self.job, at, attempt=0)
        if spec.held:
            self._reason(ns(at), "JobHeldUser")
        self.state = "PENDING"

    def _array_index(self, body: ev.JobSubmitted) -> int | bool | None:
        """The task index of this job in the submission (None: not an array), False: not this job's."""
        if body.spec.array is None:
            return None if body.job_id == self.job_id else False
        try:
            indices = array_indices(body.spec.array)
        except FormatError:
            return False
        offset = self.job_id - body.job_id
        return indices[offset] if 0 <= offset < len(indices) else False

    def _allocated(self, seq: int, at: float, body: ev.JobAllocated) -> None:
        assert self.job is not None and self.queued is not None
        wait_s = round(at - self.queued.start_ns / 1e9, 3)
        self.queued.attributes["corral.wait_s"] = wait_s
        self.queued.end(seq, ns(at))
        self.queued = None
        if "corral.wait_s" not in self.job.attributes:
            self.job.attributes["corral.wait_s"] = wait_s
        self.job.attributes["corral.partition"] = body.partition
        self.job.attributes["corral.nodes"] = [a.node for a in body.allocations]
        self.state, self.nodes, self.run_exit = "RUNNING", list(body.allocations), None
        self.attempt_seq = seq
        self.current = self._open(
            "attempt",
            f"attempt {body.attempt}",
            self.job,
            at,
            attempt=body.attempt,
            attributes={
                "corral.attempt": body.attempt,
                "corral.partition": body.partition,
                "corral.nodes": [a.node for a in body.allocations],
                "corral.time_limit_s": body.time_limit_s if body.time_limit_s is not None else "",
            },
        )
        for i, alloc in enumerate(body.allocations):
            self.children[("launch", alloc.node)] = self._open(
                "launch",
                f"launch {alloc.node}",
                self.current,
                at,
                attempt=body.attempt,
                node=alloc.node,
                attributes=self._node_attributes(alloc, i),
            )

    def _node_attributes(self, alloc: ev.NodeAllocation, index: int) -> dict[str, AttrValue]:
        return {
            "host.name": alloc.node,
            "corral.node.role": "batch" if index == 0 else "peer",
            "corral.gpu.indices": list(alloc.gpus),
            "corral.gpu.count": len(alloc.gpus),
            "corral.gpu.type": (self.gpu_type or self.gpu_types.get(alloc.node, "")) if alloc.gpus else "",
            "corral.cpus": alloc.cpus,
            "corral.attempt": self.attempt,
        }

    def _run_started(self, seq: int, at: float, body: ev.RunStarted) -> None:
        # The batch node's start is the run's start on every node of the allocation.
        for i, alloc in enumerate(self.nodes):
            launch = self.children.pop(("launch", alloc.node), None)
            if launch is None or ("run", alloc.node) in self.children:
                continue
            launch.end(seq, ns(at))
            attributes = self._node_attributes(alloc, i)
            if alloc.node == body.node:
                attributes["process.pid"] = body.pid
            self.children[("run", alloc.node)] = self._open(
                "run",
                f"run {alloc.node}",
                self.current,
                at,
                attempt=self.attempt,
                node=alloc.node,
                attributes=attributes,
            )

    def _run_exited(self, seq: int, at: float, body: ev.RunExited) -> None:
        assert self.current is not None
        batch = bool(self.nodes) and body.node == self.nodes[0].node
        span = self.children.pop(("run", body.node), None) or self.children.pop(("launch", body.node), None)
        failed = body.exit_code != 0 or body.signal != 0 or body.oom or body.launch_error is not None
        message = body.launch_error or ("out of memory" if body.oom else "")
        if span is not None and (batch or span.kind == "run"):
            span.attributes |= {
                "process.exit.code": body.exit_code,
                "corral.run.signal": body.signal,
                "corral.run.oom": body.oom,
                "corral.run.killed": body.killed,
                "corral.run.timed_out": body.timed_out,
            }
            if body.launch_error:
                span.attributes["error.type"] = "LaunchFailed"
            span.end(seq, ns(at), "error" if failed and batch else "unset", message)
        elif span is not None:
            span.end(seq, ns(at))
        if batch:
            self.run_exit = (seq, at)
            if body.timed_out:
                self.current.event(
                    "time_limit",
                    ns(at),
                    {
                        "corral.time_limit_s": self.current.attributes.get("corral.time_limit_s", ""),
                        "host.name": body.node,
                    },
                )

    def _step(self, seq: int, at: float, body: ev.StepStarted | ev.StepExited) -> None:
        key = ("step", str(body.step_id))
        if isinstance(body, ev.StepStarted):
            if key in self.children:
                return
            parent = self.children.get(("run", body.node), self.current)
            self.children[key] = self._open(
                "step",
                f"step {self.job_id}.{body.step_id} {body.name}",
                parent,
                at,
                attempt=self.attempt,
                node=f"step:{body.step_id}",
                attributes={
                    "corral.step.id": body.step_id,
                    "corral.step.name": body.name,
                    "corral.step.nodes": list(body.nodes),
                    "corral.step.ntasks": body.ntasks,
                    "corral.step.cpus": body.cpus,
                    "corral.step.gpus": body.gpus,
                    "corral.attempt": self.attempt,
                },
            )
            return
        span = self.children.pop(key, None)
        if span is None:
            return
        span.attributes |= {
            "process.exit.code": body.exit_code,
            "corral.run.signal": body.signal,
            "corral.run.oom": body.oom,
            "corral.run.killed": body.killed,
        }
        failed = body.exit_code != 0 or body.signal != 0 or body.oom
        span.end(seq, ns(at), "error" if failed and not body.killed else "unset")

    def _node_down(self, seq: int, at: float, body: ev.NodeDown) -> None:
        assert self.current is not None
        self.current.event(
            "node_down",
            ns(at),
            {"host.name": body.node, "corral.node.reason": body.reason, "corral.node.down_by": body.by},
        )
        for kind in ("launch", "run"):
            span = self.children.pop((kind, body.node), None)
            if span is not None:
                span.end(seq, ns(at), "error", f"node {body.node} down: {body.reason}")

    def _marked(self, at: float, body: ev.Event) -> None:
        """A mark: a span event on the queued or the attempt span."""
        target = self.queued if self.state == "PENDING" else self.current
        assert target is not None
        t = ns(at)
        if isinstance(body, ev.JobHeld):
            self._reason(t, "JobHeldAdmin" if body.admin else "JobHeldUser", by=body.by)
        elif isinstance(body, ev.JobReleased):
            self._reason(t, "Released", by=body.by)
        elif isinstance(body, ev.JobReasonChanged):
            if (body.reason, body.detail) != self.shown_reason:
                self._reason(t, body.reason, body.detail)
        elif isinstance(body, ev.JobUpdated):
            target.event("job_updated", t, {"corral.by": body.by})
        elif isinstance(body, ev.JobCancelRequested):
            self.cancel_at = at
            target.event("cancel_requested", t, {"corral.by": body.user})
        elif isinstance(body, ev.JobPreempted):
            target.event(
                "preempted",
                t,
                {
                    "corral.preempt.by_job": body.by_job,
                    "corral.preempt.mode": body.mode,
                    "corral.preempt.grace_s": body.grace_s,
                },
            )
        elif isinstance(body, ev.JobRequeueRequested):
            target.event("requeue_requested", t, {"corral.by": body.user, "corral.requeue.hold": body.hold})
        elif isinstance(body, ev.JobSignalRequested):
            target.event("signal_requested", t, {"corral.by": body.user, "corral.signal": body.signal})

    def _reason(self, at_ns: int, reason: str, detail: str = "", by: str = "") -> None:
        """A ``pending_reason`` event on the queued span: why the job waits from ``at_ns``."""
        assert self.queued is not None
        attributes: dict[str, AttrValue] = {"corral.pending.reason": reason}
        if detail:
            attributes["corral.pending.detail"] = detail
        if by:
            attributes["corral.by"] = by
        self.queued.event("pending_reason", at_ns, attributes)
        self.shown_reason = (reason, detail)

    def _requeued(self, seq: int, env: ev.Envelope, body: ev.JobRequeued) -> None:
        assert self.current is not None and self.job is not None
        at = env.meta.occurred_at
        cause = self.causes.of(env, seq, self.job_id, self.nodes, self.attempt_seq)
        self.current.event("requeued", ns(at), {"corral.requeue.reason": body.reason, **cause})
        self._close_children(seq, at)
        self.current.end(seq, ns(at))
        self.current = None
        self.attempt, self.state, self.nodes, self.run_exit = body.attempt + 1, "PENDING", [], None
        self.queued = self._open("queued", f"queued {self.attempt}", self.job, at, attempt=self.attempt)
        self.shown_reason = None
        if body.hold:
            self._reason(ns(at), "JobHeldUser")

    def _concluded(
        self, seq: int, env: ev.Envelope, body: ev.JobCompleted | ev.JobFailed | ev.JobCancelled
    ) -> None:
        assert self.job is not None
        at, t = env.meta.occurred_at, ns(env.meta.occurred_at)
        attributes: dict[str, AttrValue] = {}
        if isinstance(body, ev.JobCompleted):
            state: JobState = "COMPLETED"
            status: Status = "ok"
        elif isinstance(body, ev.JobFailed):
            state, status = lifecycle.failed_state(body.reason), "error"
            attributes |= {
                "error.type": body.reason,
                "process.exit.code": body.exit_code,
                "corral.run.signal": body.signal,
            }
            attributes |= self.causes.of(env, seq, self.job_id, self.nodes, self.attempt_seq)
        else:
            state, status = "CANCELLED", "unset"
            attributes |= {"corral.cancelled_by": body.by, "corral.run.signal": body.signal}
            attributes |= self.causes.of(env, seq, self.job_id, self.nodes, self.attempt_seq)
        attributes["corral.job.state"] = state
        message = attributes.get("error.type", "")
        if self.current is not None:
            self.current.event("concluded", t, attributes)
            self._close_children(seq, at)
            self.current.end(seq, t, status, str(message))
        if self.queued is not None:
            self.queued.end(seq, t)
        # From what set the conclusion off: the cancel request (its kill included), else the run's exit.
        start = self.cancel_at if self.cancel_at is not None else self.run_exit[1] if self.run_exit else at
        conclude = self._open("conclude", "conclude", self.job, start, attributes=attributes)
        conclude.end(seq, t, status, str(message))
        self.job.attributes |= {"corral.job.state": state, "corral.job.restart_count": self.attempt}
        self.job.end(seq, t, status, str(message))
        self.state = state

    def records(self) -> list[SpanRecord]:
        exporter: Exporter = "gateway" if self.exporter == "gateway" else "tracer"
        return [
            SpanRecord(
                name=s.name,
                kind=s.kind,
                trace_id=self.trace_id,
                span_id=s.span_id,
                parent_id=s.parent_id,
                start_ns=s.start_ns,
                end_ns=s.end_ns,
                attributes=s.attributes,
                events=sorted(s.events, key=lambda e: e.time_ns),
                status=s.status,
                status_message=s.status_message,
                end_seq=s.end_seq,
                exporter=exporter if s.kind == "submit" else "tracer",
            )
            for s in self.spans
        ]


def spans(job_id: int, entries: Iterable[tuple[int, ev.Envelope]]) -> list[SpanRecord]:
    """The spans of job ``job_id`` from its entries (see the module docstring); [] if it was never
    submitted in them. Deterministic: the same entries give the same spans, ids included."""
    ordered = sorted(entries, key=lambda entry: entry[0])
    derivation = _Derivation(job_id, ordered)
    for seq, envelope in ordered:
        derivation.apply(seq, envelope)
    return derivation.records()
