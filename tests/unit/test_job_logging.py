"""Every log line about a job carries job_id, trace_id and span_id: the job's trace context bound for the
block (``telemetry.about_job``), and a live span's ids over them while one is current."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from corral.libs.runtime import telemetry

pytestmark = pytest.mark.unit

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _line() -> dict[str, Any]:
    """What the configured pipeline adds to a log line now (contextvars, then the live span's ids)."""
    event = structlog.contextvars.merge_contextvars(None, "info", {"event": "x"})
    event = telemetry.add_job_fields(None, "info", event)
    return dict(telemetry.add_trace_ids(None, "info", event))


def test_a_log_line_about_a_job_names_the_job_and_its_trace() -> None:
    with telemetry.about_job(12, TRACEPARENT):
        assert _line() == {
            "event": "x",
            "job_id": 12,
            "trace_id": "0af7651916cd43dd8448eb211c80319c",
            "span_id": "b7ad6b7169203331",
        }
        tracer = telemetry.provider("test", None).get_tracer("t")
        with tracer.start_as_current_span("launch", context=telemetry.extract(TRACEPARENT)) as span:
            line = _line()
            assert line["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
            assert line["span_id"] == format(span.get_span_context().span_id, "016x") != "b7ad6b7169203331"
    assert _line() == {"event": "x"}
    with telemetry.about_job(13, "not a traceparent"):
        assert _line() == {"event": "x", "job_id": 13}


def test_without_an_endpoint_spans_are_not_recorded_but_jobs_still_get_trace_ids() -> None:
    """``configure`` with no OTLP target: no span is recorded (no span work beyond ids), yet the gateway's
    ``submit`` span still names a trace for the job's traceparent and its log lines."""
    tracer = telemetry.ids_only("test").get_tracer("t")
    with tracer.start_as_current_span("submit", attributes={"enduser.id": "alice"}) as span:
        assert not span.is_recording()
        traceparent = telemetry.inject()
        assert traceparent is not None
        assert _line()["span_id"] == format(span.get_span_context().span_id, "016x")
    with telemetry.attached(TRACEPARENT), tracer.start_as_current_span("submit") as child:
        assert not child.is_recording()
        assert format(child.get_span_context().trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"


def test_a_process_that_exports_records_the_spans_of_a_job_whose_trace_was_not_sampled() -> None:
    """A job submitted where no endpoint was set carries an unsampled traceparent (flags 00); an agent or
    scheduler that exports still records its spans in that trace."""
    unsampled = TRACEPARENT[:-2] + "00"
    tracer = telemetry.provider("test", None).get_tracer("t")
    with telemetry.attached(unsampled), tracer.start_as_current_span("launch") as span:
        assert span.is_recording()
        assert format(span.get_span_context().trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"


def test_an_inner_job_block_names_its_own_job_until_it_ends_and_a_line_keeps_its_own_fields() -> None:
    with telemetry.about_job(1, None):
        with telemetry.about_job(2, TRACEPARENT):
            assert _line()["job_id"] == 2
        assert _line() == {"event": "x", "job_id": 1}
        named = telemetry.add_job_fields(None, "info", {"event": "x", "job_id": 7})
        assert named == {"event": "x", "job_id": 7}
    assert _line() == {"event": "x"}


async def test_job_blocks_of_concurrent_tasks_do_not_mix() -> None:
    import asyncio

    async def one(job: int) -> int:
        with telemetry.about_job(job, None):
            await asyncio.sleep(0.01 * (3 - job))
            return int(_line()["job_id"])

    assert await asyncio.gather(one(1), one(2)) == [1, 2]


def test_current_makes_the_span_current_ends_it_and_records_an_error() -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = telemetry.provider("test", None)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with telemetry.current(tracer.start_span("ok")) as span:
        assert trace.get_current_span() is span
    assert trace.get_current_span() is not span
    with pytest.raises(ValueError), telemetry.current(tracer.start_span("fails")):
        raise ValueError("no such partition")
    telemetry.ended(tracer.start_span("never current"), None)
    ok, failed, plain = exporter.get_finished_spans()
    assert (ok.name, failed.name, plain.name) == ("ok", "fails", "never current")
    assert ok.status.status_code == trace.StatusCode.UNSET
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert failed.status.description == "ValueError: no such partition"
    assert [e.name for e in failed.events] == ["exception"]
