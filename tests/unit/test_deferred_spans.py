"""Deferred spans: recorded as values inside the block, made SDK spans later with exactly that content (name,
parent, kind, times, attributes, links, an exception's status and event), by a pass or the recorder's
thread; nothing without a recorder; a bounded queue."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from corral.libs.runtime import telemetry
from corral.libs.runtime.deferred_spans import Deferred, DeferredTracer

pytestmark = pytest.mark.unit

JOB = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER = "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"


def _rig(**kwargs: float) -> tuple[Deferred, DeferredTracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    deferred = Deferred(**kwargs)  # type: ignore[arg-type]
    return deferred, DeferredTracer("corral.test", deferred, provider), exporter


def test_a_span_is_made_later_with_what_the_block_recorded() -> None:
    deferred, spans, exporter = _rig()
    before = time.time_ns()
    with spans.span(
        "append job_allocated",
        context=telemetry.extract(JOB),
        attributes={"corral.actor": "scheduler"},
        links=telemetry.links([OTHER]),
        kind=SpanKind.CLIENT,
    ) as attributes:
        attributes["corral.log.seq"] = 7
    after = time.time_ns()
    assert exporter.get_finished_spans() == ()  # not made yet: only recorded
    assert deferred.flush() == 1
    [span] = exporter.get_finished_spans()
    assert span.name == "append job_allocated" and span.kind is SpanKind.CLIENT
    assert dict(span.attributes or {}) == {"corral.actor": "scheduler", "corral.log.seq": 7}
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    assert f"{span.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert [f"{link.context.trace_id:032x}" for link in span.links] == ["1af7651916cd43dd8448eb211c80319c"]
    assert span.start_time is not None and span.end_time is not None
    assert before <= span.start_time <= span.end_time <= after
    assert span.status.status_code is StatusCode.UNSET
    assert deferred.flush() == 0


def test_a_root_span_with_an_earlier_start() -> None:
    deferred, spans, exporter = _rig()
    began = time.time_ns() - 5_000_000
    with spans.span("scheduling cycle", context=telemetry.extract(None), start_ns=began):
        pass
    deferred.flush()
    [span] = exporter.get_finished_spans()
    assert span.parent is None and span.start_time == began


def test_an_exception_leaving_the_block_is_the_span_s_error_and_still_raised() -> None:
    deferred, spans, exporter = _rig()
    with pytest.raises(ValueError, match="stale"), spans.span("append x", context=telemetry.extract(JOB)):
        raise ValueError("stale")
    deferred.flush()
    [span] = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError: stale"
    assert [e.name for e in span.events] == ["exception"]


def test_without_a_recorder_nothing_is_recorded() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans = DeferredTracer("corral.test", None, provider)  # the process's recorder: none in unit tests
    with spans.span("launch", context=telemetry.extract(JOB), attributes={"a": 1}) as attributes:
        attributes["b"] = 2
    assert exporter.get_finished_spans() == ()


def test_the_queue_is_bounded_and_counts_what_it_drops() -> None:
    deferred, spans, _ = _rig(max_pending=3)
    for _ in range(5):
        with spans.span("append x", context=telemetry.extract(JOB)):
            pass
    assert deferred.dropped == 2 and deferred.flush() == 3


def test_the_thread_makes_them_and_stopping_makes_the_rest() -> None:
    deferred, spans, exporter = _rig(flush_s=0.05)
    deferred.start()
    try:
        with spans.span("append x", context=telemetry.extract(JOB)):
            pass
        deadline = time.monotonic() + 30
        while not exporter.get_finished_spans() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(exporter.get_finished_spans()) == 1  # made by the thread, no flush called
    finally:
        deferred.stop()
    with spans.span("append y", context=telemetry.extract(JOB)):
        pass
    deferred.stop()  # what is left at exit is made
    assert [s.name for s in exporter.get_finished_spans()] == ["append x", "append y"]
