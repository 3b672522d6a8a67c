"""Derived span records as OpenTelemetry SDK spans, exported by the SDK's own OTLP exporter.

A ``SpanRecord`` already has its ids, times, attributes, events and status; ``readable`` builds the SDK's
``ReadableSpan`` with exactly those (its ``SpanContext`` carries the derived ids, not random ones), and
``export`` hands a list to a ``SpanExporter`` (``telemetry.span_exporter``: OTLP/HTTP) synchronously, so
the shell acks the log entries only after the backend took their spans.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from corral.libs.runtime.errors import TransientError
from corral.libs.trace.spans import SpanRecord

#: The resource of the derived spans: a job's phases belong to the cluster, not to one service process.
RESOURCE = Resource.create({"service.name": "corral-jobs"})
SCOPE = InstrumentationScope("corral.libs.trace")
_STATUS = {"unset": StatusCode.UNSET, "ok": StatusCode.OK, "error": StatusCode.ERROR}


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(1))


def readable(record: SpanRecord) -> ReadableSpan:
    """The SDK span of an ended record."""
    assert record.end_ns is not None, record
    return ReadableSpan(
        name=record.name,
        context=_context(record.trace_id, record.span_id),
        parent=_context(record.trace_id, record.parent_id) if record.parent_id else None,
        resource=RESOURCE,
        attributes={"corral.span.kind": record.kind, **record.attributes},
        events=[Event(e.name, e.attributes, e.time_ns) for e in record.events],
        status=Status(_STATUS[record.status], record.status_message or None)
        if record.status == "error"
        else Status(_STATUS[record.status]),
        start_time=record.start_ns,
        end_time=record.end_ns,
        instrumentation_scope=SCOPE,
    )


def export(exporter: SpanExporter, records: Sequence[SpanRecord]) -> None:
    """Export ``records`` now; TransientError if the backend did not take them (the entries are retried)."""
    if not records:
        return
    result = exporter.export([readable(r) for r in records])
    if result is not SpanExportResult.SUCCESS:
        raise TransientError(f"the OTLP endpoint did not take {len(records)} spans; retrying")
