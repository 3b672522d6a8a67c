"""The pieces a job's spans are built from (``derive.py``): a span while it is open, and the attributes of a
job and of its nodes, named after OpenTelemetry's semantic conventions where one exists (``host.name``,
``enduser.id``), else ``corral.*``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.libs.trace.spans import AttrValue, Exporter, SpanEvent, SpanKind, SpanRecord, Status
from corral.schemas import events as ev


@dataclass
class OpenSpan:
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

    def record(self, trace_id: str, exporter: Exporter) -> SpanRecord:
        """The span as exported (the gateway exports its own ``submit``, the tracer every other span)."""
        return SpanRecord(
            name=self.name,
            kind=self.kind,
            trace_id=trace_id,
            span_id=self.span_id,
            parent_id=self.parent_id,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            attributes=self.attributes,
            events=sorted(self.events, key=lambda e: e.time_ns),
            status=self.status,
            status_message=self.status_message,
            end_seq=self.end_seq,
            exporter=exporter if self.kind == "submit" else "tracer",
        )


def array_index(job_id: int, body: ev.JobSubmitted) -> int | bool | None:
    """The task index of job ``job_id`` in the submission (None: not an array), False: not this job's."""
    if body.spec.array is None:
        return None if body.job_id == job_id else False
    try:
        indices = array_indices(body.spec.array)
    except FormatError:
        return False
    offset = job_id - body.job_id
    return indices[offset] if 0 <= offset < len(indices) else False


def job_attributes(job_id: int, body: ev.JobSubmitted, index: int | None) -> dict[str, AttrValue]:
    """The job span's attributes from its submission (``index``: its array task index, if any)."""
    spec = body.spec
    attributes: dict[str, AttrValue] = {
        "corral.job.id": job_id,
        "corral.job.name": spec.name,
        "enduser.id": body.user,
        "corral.account": spec.account or "",
        "corral.partition": spec.partition or "",
        "corral.qos": spec.qos or "",
        "corral.job.node_count": spec.nodes,
        "corral.gpu.count": spec.gpus_per_node * spec.nodes,
        "corral.gpu.type": spec.gpu_type or "",
    }
    if index is not None:
        attributes |= {"corral.array.job_id": body.job_id, "corral.array.task_id": index}
    return attributes


def node_attributes(
    alloc: ev.NodeAllocation, index: int, gpu_type: str, attempt: int
) -> dict[str, AttrValue]:
    """A node's launch or run span attributes: its place in the allocation (the first node runs the batch
    script), its GPUs (``gpu_type``: the type asked for, else the node's registered one) and the attempt."""
    return {
        "host.name": alloc.node,
        "corral.node.role": "batch" if index == 0 else "peer",
        "corral.gpu.indices": list(alloc.gpus),
        "corral.gpu.count": len(alloc.gpus),
        "corral.gpu.type": gpu_type if alloc.gpus else "",
        "corral.cpus": alloc.cpus,
        "corral.attempt": attempt,
    }


def mark_event(body: ev.Event) -> tuple[str, dict[str, AttrValue]] | None:
    """The span event a mark on the queued or attempt span becomes (who asked, the preemptor), or None."""
    if isinstance(body, ev.JobUpdated):
        return "job_updated", {"corral.by": body.by}
    if isinstance(body, ev.JobCancelRequested):
        return "cancel_requested", {"corral.by": body.user}
    if isinstance(body, ev.JobPreempted):
        preempted: dict[str, AttrValue] = {
            "corral.preempt.by_job": body.by_job,
            "corral.preempt.mode": body.mode,
            "corral.preempt.grace_s": body.grace_s,
        }
        return "preempted", preempted
    if isinstance(body, ev.JobRequeueRequested):
        return "requeue_requested", {"corral.by": body.user, "corral.requeue.hold": body.hold}
    if isinstance(body, ev.JobSignalRequested):
        return "signal_requested", {"corral.by": body.user, "corral.signal": body.signal}
    return None
