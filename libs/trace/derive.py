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
        │           └── task <rank> <node>  the task's start → its end, ended by StepExited (``tasks.py``)
        └── conclude                   the last run's exit (or the cancel request) → the conclusion

The entries are followed along the job state machine of ``schemas.lifecycle``: an event counts only in
the states its transition or mark lists and for the current attempt (a late fact of an earlier run changes
nothing), as the fold does (``coverage.counts``; every event type is handled or listed in
``coverage.IGNORED``); a decision of a leader epoch older than one seen changes nothing (the fold's
fence: the entries may include other jobs' decisions that raised the epoch, which count for nothing else).
What the queued span's ``pending_reason`` events hold, and why a peer node's launch and run take the batch
node's start: ``docs/decisions/tracing.md``.
"""

from __future__ import annotations

from collections.abc import Iterable

from corral.libs.trace.building import OpenSpan, array_index, job_attributes, mark_event, node_attributes
from corral.libs.trace.causes import Causes
from corral.libs.trace.coverage import CONCLUSIONS, counts
from corral.libs.trace.spans import (
    AttrValue,
    Exporter,
    SpanKind,
    SpanRecord,
    Status,
    ns,
    parse_traceparent,
    span_id_for,
    trace_id_for,
)
from corral.libs.trace.tasks import step_ended
from corral.schemas import events as ev
from corral.schemas import lifecycle
from corral.schemas.lifecycle import JobState


class _Derivation:
    """The job's spans as its entries come, in log order."""

    def __init__(self, job_id: int, entries: list[tuple[int, ev.Envelope]]) -> None:
        self.job_id = job_id
        self.causes = Causes(entries)
        self.state: JobState | None = None
        self.attempt = 0  # the current (or next) attempt: the job's restart count
        self.trace_id = ""
        self.exporter: str = "tracer"
        self.spans: list[OpenSpan] = []
        self.job: OpenSpan | None = None
        self.queued: OpenSpan | None = None
        self.current: OpenSpan | None = None  # the current attempt's span
        self.children: dict[
            tuple[str, str], OpenSpan
        ] = {}  # (kind, node or step) -> open span of the attempt
        self.nodes: list[ev.NodeAllocation] = []  # the current attempt's allocation
        self.run_exit: tuple[int, float] | None = None  # (seq, time) of the batch node's exit, this attempt
        self.cancel_at: float | None = None  # when a cancel was requested
        self.gpu_type = ""  # the GPU type the job asked for ("" = any)
        self.gpu_types: dict[str, str] = {}  # node -> its GPUs' type, as it last registered
        self.array_id = 0  # the submission's job id (an array's first task)
        self.attempt_seq = 0  # log position of the current attempt's allocation
        self.shown_reason: tuple[str, str] | None = None  # the queued span's newest pending reason, detail
        self.epoch = 0  # the newest leader epoch seen in a decision (the fold's fence)

    # spans -------------------------------------------------------------------------------------------
    def _open(
        self,
        kind: SpanKind,
        name: str,
        parent: OpenSpan | None,
        at: float,
        attempt: int | None = None,
        node: str = "",
        attributes: dict[str, AttrValue] | None = None,
    ) -> OpenSpan:
        span = OpenSpan(
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
        if type(body) in lifecycle.DECISIONS:
            # The fold's fence: a deposed leader's decision is no span data (one of another job may raise it).
            if body.epoch < self.epoch:  # type: ignore[union-attr]
                return
            self.epoch = body.epoch  # type: ignore[union-attr]
        if isinstance(body, ev.NodeRegistered):
            self.gpu_types[body.node] = body.gpu_type or ""
            return
        if isinstance(body, ev.JobSubmitted):
            self._submitted(seq, env, body)
            return
        if self.job is None or self.state is None:
            return
        if not counts(body, self.job_id, self.array_id, self.state, self.attempt, self.nodes):
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
        elif isinstance(body, CONCLUSIONS):
            self._concluded(seq, env, body)
        else:
            self._marked(at, body)

    def _submitted(self, seq: int, env: ev.Envelope, body: ev.JobSubmitted) -> None:
        if self.job is not None:
            return
        index = array_index(self.job_id, body)
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
        submit = OpenSpan(
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
        attributes = job_attributes(self.job_id, body, index)
        self.job = self._open("job", f"job {self.job_id}", submit, at, attributes=attributes)
        self.queued = self._open("queued", "queued", self.job, at, attempt=0)
        if spec.held:
            self._reason(ns(at), "JobHeldUser")
        self.state = "PENDING"

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
                attributes=node_attributes(
                    alloc, i, self.gpu_type or self.gpu_types.get(alloc.node, ""), self.attempt
                ),
            )

    def _gpu_type(self, node: str) -> str:
        """The GPU type a node's spans name: the one the job asked for, else the node's registered one."""
        return self.gpu_type or self.gpu_types.get(node, "")

    def _run_started(self, seq: int, at: float, body: ev.RunStarted) -> None:
        # The batch node's start is the run's start on every node of the allocation.
        for i, alloc in enumerate(self.nodes):
            launch = self.children.pop(("launch", alloc.node), None)
            if launch is None or ("run", alloc.node) in self.children:
                continue
            launch.end(seq, ns(at))
            attributes = node_attributes(
                alloc, i, self.gpu_type or self.gpu_types.get(alloc.node, ""), self.attempt
            )
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
        if span is not None:
            self.spans += step_ended(span, seq, at, body, self.trace_id, self.attempt)

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
        else:
            if isinstance(body, ev.JobCancelRequested):
                self.cancel_at = at
            marked = mark_event(body)
            if marked is not None:
                target.event(marked[0], t, marked[1])

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


def spans(job_id: int, entries: Iterable[tuple[int, ev.Envelope]]) -> list[SpanRecord]:
    """The spans of job ``job_id`` from its entries (see the module docstring); [] if it was never
    submitted in them. Deterministic: the same entries give the same spans, ids included."""
    ordered = sorted(entries, key=lambda entry: entry[0])
    derivation = _Derivation(job_id, ordered)
    for seq, envelope in ordered:
        derivation.apply(seq, envelope)
    exporter: Exporter = "gateway" if derivation.exporter == "gateway" else "tracer"
    return [span.record(derivation.trace_id, exporter) for span in derivation.spans]
