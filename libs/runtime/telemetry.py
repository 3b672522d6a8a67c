"""Logs and traces: structlog JSON lines, OpenTelemetry tracing, W3C trace context in NATS headers.

- ``configure(service)`` once per process: structlog renders JSON with the service name, and the
  current span's trace id / span id on every line; OpenTelemetry exports spans over OTLP/HTTP
  when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (read by the settings of each service, passed here).
- ``inject()`` returns the W3C ``traceparent`` of the current span (for NATS headers and the
  envelope's meta); ``extract(traceparent)`` gives a context to start child spans under.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()


def _add_trace_ids(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid:
        event["trace_id"] = format(ctx.trace_id, "032x")
        event["span_id"] = format(ctx.span_id, "016x")
    return event


def configure(service: str, otlp_endpoint: str | None = None, level: int = logging.INFO) -> None:
    """Set up JSON logging to stderr and tracing for one service process."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_ids,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    provider = TracerProvider(resource=Resource.create({"service.name": f"corral-{service}"}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    trace.set_tracer_provider(provider)


def tracer(name: str) -> trace.Tracer:
    """A tracer for one module."""
    return trace.get_tracer(name)


def inject() -> str | None:
    """The W3C traceparent of the current span, if there is one."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def extract(traceparent: str | None) -> context.Context:
    """A context whose parent is the span named by ``traceparent`` (the root if None)."""
    if not traceparent:
        return context.Context()
    return _propagator.extract({"traceparent": traceparent})


def logger(**bound: Any) -> Any:
    """A structlog logger with fields bound."""
    return structlog.get_logger().bind(**bound)
