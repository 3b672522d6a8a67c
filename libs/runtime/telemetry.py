"""Logs and traces: structlog JSON lines, OpenTelemetry tracing, W3C trace context in NATS headers.

- ``configure(service)`` once per process: structlog renders JSON with the service name, and the
  current span's trace id / span id on every line; OpenTelemetry exports spans over OTLP/HTTP
  (protobuf) to the target the standard ``OTEL_EXPORTER_OTLP_*`` variables name
  (``corral.libs.config.otlp``: a base endpoint gets ``/v1/traces`` appended, a traces endpoint is used
  as-is), read by each service's settings and passed here. Without a target no span is recorded
  (``ids_only``): spans get ids, for the job's ``traceparent`` and the log lines, and nothing else.
- ``span_exporter(target)`` is that exporter, for the tracer service's derived spans too.
- ``inject()`` returns the W3C ``traceparent`` of the current span (for NATS headers and the
  envelope's meta); ``extract(traceparent)`` gives a context to start child spans under;
  ``attached(traceparent)`` makes it the current context for a block (a request's handler);
- ``about_job(job_id, traceparent)``: every log line in the block carries ``job_id``, ``trace_id`` and
  ``span_id`` (the current live span's ids when there is one, else the job's trace context);
- ``current(span)`` makes a started span the current one for a block and ends it (the hot paths' cheaper
  ``start_as_current_span``); ``ended(span, exc)`` ends one that was never current.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sys
from collections.abc import Iterable, Iterator, MutableMapping
from typing import Any

import structlog
from opentelemetry import context, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from corral.libs.config.otlp import OtlpTarget
from corral.libs.trace.spans import parse_traceparent

_propagator = TraceContextTextMapPropagator()


def add_trace_ids(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the current live span's trace id and span id, over those bound for a job."""
    span = trace.get_current_span()
    ctx = span.get_span_context()
    if ctx.is_valid:
        event["trace_id"] = format(ctx.trace_id, "032x")
        event["span_id"] = format(ctx.span_id, "016x")
    return event


def span_exporter(target: OtlpTarget) -> SpanExporter:
    """The OTLP/HTTP (protobuf) exporter that POSTs spans to ``target.url`` exactly.

    Its HTTP session takes the proxy for the URL from the environment (``HTTPS_PROXY``, ``NO_PROXY`` ...)
    once, here: left to ``requests``, every POST scans the whole environment for proxy variables twice,
    about half of a small export's CPU. The CA bundle is ``OTEL_EXPORTER_OTLP_CERTIFICATE`` as before (the
    exporter sets it); ``REQUESTS_CA_BUNDLE`` and ``~/.netrc`` are not read."""
    import requests
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    session = requests.Session()
    session.trust_env = False
    session.proxies = requests.utils.get_environ_proxies(target.url)
    return OTLPSpanExporter(endpoint=target.url, headers=target.headers, session=session)


def provider(service: str, target: OtlpTarget | None) -> TracerProvider:
    """A tracer provider for ``corral-<service>`` that exports to ``target`` in batches (none: no export)."""
    # ALWAYS_ON, not the default ParentBased: Corral traces every job, and a job whose traceparent was made
    # where no endpoint was set (ids only: flags 00, ``ids_only``) or by a caller that sampled its own trace
    # out would otherwise lose every span this process adds to it.
    tracer_provider = TracerProvider(
        sampler=sampling.ALWAYS_ON, resource=Resource.create({"service.name": f"corral-{service}"})
    )
    if target is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter(target)))
    return tracer_provider


def ids_only(service: str) -> TracerProvider:
    """The provider of a process that exports no spans: it records none (the ``ALWAYS_OFF`` sampler: no
    span objects, attributes or processors), but every span still gets ids, so a job still gets a
    ``traceparent`` and its log lines a trace id and span id."""
    return TracerProvider(
        sampler=sampling.ALWAYS_OFF, resource=Resource.create({"service.name": f"corral-{service}"})
    )


def configure(service: str, target: OtlpTarget | None = None, level: int = logging.INFO) -> None:
    """Set up JSON logging to stderr and tracing for one service process."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_job_fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_ids,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
    trace.set_tracer_provider(provider(service, target) if target is not None else ids_only(service))


def tracer(name: str) -> trace.Tracer:
    """A tracer for one module."""
    return trace.get_tracer(name)


def inject() -> str | None:
    """The W3C traceparent of the current span, if there is one (formatted as the W3C propagator does,
    without its carrier)."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def extract(traceparent: str | None) -> context.Context:
    """A context whose parent is the span named by ``traceparent`` (the root if None)."""
    if not traceparent:
        return context.Context()
    return _extracted(traceparent)


@functools.lru_cache(maxsize=4096)
def _extracted(traceparent: str) -> context.Context:
    """The W3C propagator's context of ``traceparent``: a job's appends and orders name the same one again
    and again, and a context is immutable, so each is parsed once."""
    return _propagator.extract({"traceparent": traceparent})


#: The most links a batch's span keeps (one per distinct trace of its messages).
MAX_LINKS = 32


def links(traceparents: Iterable[str | None]) -> list[trace.Link]:
    """Links to the spans ``traceparents`` name, each once and at most ``MAX_LINKS``: how a span that works
    on a batch of many jobs' messages (a Postgres transaction of the projection) joins each job's trace
    without being any one job's child (OpenTelemetry's messaging conventions for batches)."""
    found: dict[str, trace.Link] = {}
    for traceparent in traceparents:
        if not traceparent or traceparent in found or len(found) >= MAX_LINKS:
            continue
        span = trace.get_current_span(extract(traceparent)).get_span_context()
        if span.is_valid:
            found[traceparent] = trace.Link(span)
    return list(found.values())


#: The fields ``about_job`` binds for the block it runs (one context variable: binding them as structlog
#: contextvars made one variable per field, ~7 µs a block, for every job a gateway appends).
_job_fields: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "corral_job_fields", default=None
)


def add_job_fields(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the fields ``about_job`` bound (``job_id``, the job's trace ids), unless the
    line names them itself; ``add_trace_ids`` after it puts a live span's ids over the job's."""
    fields = _job_fields.get()
    if fields:
        for key, value in fields.items():
            event.setdefault(key, value)
    return event


class about_job:  # lower case: used as a function, ``with telemetry.about_job(...)``
    """Bind ``job_id`` and the job's trace ids to the log lines of the block (``add_job_fields``); a block
    inside another binds its own job in place of the outer one until it ends."""

    __slots__ = ("_fields", "_token")

    def __init__(self, job_id: int, traceparent: str | None) -> None:
        fields: dict[str, Any] = {"job_id": job_id}
        ids = parse_traceparent(traceparent)
        if ids is not None:
            fields["trace_id"], fields["span_id"] = ids
        self._fields = fields
        self._token: contextvars.Token[dict[str, Any] | None] | None = None

    def __enter__(self) -> None:
        self._token = _job_fields.set(self._fields)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _job_fields.reset(self._token)


class current:  # lower case: used as a function, ``with telemetry.current(span) as span``
    """``span`` made the current span for the block and ended after it, an exception recorded on it (its
    status set to ERROR): what ``tracer.start_as_current_span`` does, without its three generator-based
    context managers (~8 µs of the ~27 a span costs there; the gateway makes two per submitted job)."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._token: object = None

    def __enter__(self) -> trace.Span:
        self._token = context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        context.detach(self._token)  # type: ignore[arg-type]
        ended(self._span, exc)


def ended(span: trace.Span, exc: BaseException | None) -> None:
    """End ``span``; an ``Exception`` that ended its block recorded on it first, as OpenTelemetry's
    ``use_span`` does (not a BaseException such as a cancellation)."""
    if isinstance(exc, Exception) and span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, description=f"{type(exc).__name__}: {exc}"))
    span.end()


@contextlib.contextmanager
def attached(traceparent: str | None) -> Iterator[None]:
    """Within the block, spans started without an explicit context are children of ``traceparent``
    (nothing changes when it is None or invalid)."""
    if not traceparent:
        yield
        return
    token = context.attach(extract(traceparent))
    try:
        yield
    finally:
        context.detach(token)


def logger(**bound: Any) -> Any:
    """A structlog logger with fields bound."""
    return structlog.get_logger().bind(**bound)
