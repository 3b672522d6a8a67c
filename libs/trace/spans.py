"""A job's spans as plain data, and their deterministic ids.

A ``SpanRecord`` is what ``derive.spans`` returns for one phase of a job: its name and kind, W3C ids, parent,
start and end (ns since the epoch; ``end_ns`` None while the phase is still open), attributes, span events
and status, and ``end_seq``: the log position of the entry that ended it. The tracer service exports a span
exactly when it processes that entry; ``corral trace`` draws them all.

Ids are a hash, never random, so that deriving again (after a restart, a replay, on another machine) gives
the same ids:

- the trace id is the submitter's: the one in the job's ``traceparent`` (the gateway's submit span, itself
  a child of the caller's ``TRACEPARENT`` when there was one); a log entry without one gets a trace id
  derived from the job and its submission's event id;
- a span id is the first 8 bytes of SHA-256 over (trace id, job, attempt, node, kind).
"""

from __future__ import annotations

import hashlib
from typing import Literal

import msgspec

#: An attribute's value, as OpenTelemetry allows (a homogeneous list for several values).
AttrValue = str | int | float | bool | list[str] | list[int]

#: What phase of a job a span is.
SpanKind = Literal["submit", "job", "queued", "attempt", "launch", "run", "step", "task", "conclude"]

#: Who exports a span: the gateway's own live submit span, or the tracer from the log.
Exporter = Literal["gateway", "tracer"]

#: A span's status, as OpenTelemetry's StatusCode.
Status = Literal["unset", "ok", "error"]


class SpanEvent(msgspec.Struct, frozen=True, kw_only=True):
    """Something that happened at one instant of a span (a hold, a requeue, a node going down)."""

    name: str  # e.g. "requeued", "node_down", "preempted"
    time_ns: int  # when, ns since the epoch
    attributes: dict[str, AttrValue] = {}  # what and why (the cause's fields)


class SpanRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One span of a job's trace."""

    name: str  # display name, e.g. "attempt 1", "run node2"
    kind: SpanKind  # which phase
    trace_id: str  # 32 lower-case hex digits
    span_id: str  # 16 lower-case hex digits
    parent_id: str | None  # the parent span's id; None for the trace's root in the log (the submit)
    start_ns: int  # start, ns since the epoch
    end_ns: int | None  # end; None while the phase is open
    attributes: dict[str, AttrValue] = {}  # semantic-convention names where one exists, else corral.*
    events: list[SpanEvent] = []  # in time order
    status: Status = "unset"  # ok, error (with ``status_message``) or unset
    status_message: str = ""  # why the status is error
    end_seq: int = 0  # log position of the entry that ended it (0 while open)
    exporter: Exporter = "tracer"  # who exports it


def trace_id_for(job_id: int, submit_event_id: str) -> str:
    """The trace id of a job whose submission carried no trace context."""
    return hashlib.sha256(f"corral-trace:{job_id}:{submit_event_id}".encode()).hexdigest()[:32]


def span_id_for(trace_id: str, job_id: int, attempt: int | None, node: str, kind: str) -> str:
    """The span id of one phase: a hash of (trace, job, attempt, node, kind), never all zeros."""
    digest = hashlib.sha256(f"{trace_id}:{job_id}:{attempt}:{node}:{kind}".encode()).hexdigest()[:16]
    return digest if int(digest, 16) else "0000000000000001"


def parse_traceparent(traceparent: str | None) -> tuple[str, str] | None:
    """(trace id, span id) of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``); None if invalid."""
    if not traceparent:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    trace_id, span_id = parts[1].lower(), parts[2].lower()
    try:
        if not int(trace_id, 16) or not int(span_id, 16):
            return None
    except ValueError:
        return None
    return trace_id, span_id


def ns(seconds: float) -> int:
    """Seconds since the epoch (an envelope's ``occurred_at``) as ns."""
    return round(seconds * 1e9)
