"""Short live spans recorded on a latency path and made OpenTelemetry spans off it.

The OpenTelemetry SDK spends 45-50 µs of CPU making a span with a few attributes on this project's
machines (``bench/RESULTS.md``), and a submit's few milliseconds share two cores with every service that
reacts to it. Spans that nothing refers to while they run can be made later with exactly the same content:

- an append (``append <tag>``, ``libs/runtime/bus.py``): a leaf of the job's trace;
- the agent's ``launch``: a leaf too (the job's processes name the attempt's derived span, not this one);
- a scheduling cycle and a Postgres transaction of accounting: roots of their own, in no job's trace.

``DeferredTracer(name).span(...)`` records such a span as plain values (name, parent context, kind, start and
end time, attributes, links, the exception that ended it) for the cost of two clock reads; a thread makes
each one an SDK span with those values (``start_span(start_time=...)``, ``end(end_time=...)``) every
``FLUSH_S``, through the provider's own processors and exporter, and once more at exit. A backend gets the
span it would have got. What differs: a log line inside the block carries the job's trace ids (bound by
``telemetry.about_job``), not this span's id; and a span still pending when the process is killed is lost,
like the spans in a batch processor's queue.

Without an exporting provider (``telemetry.ids_only``) nothing is recorded: ``enable`` is called only by
``telemetry.configure`` with an OTLP target.
"""

from __future__ import annotations

import atexit
import collections
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

#: Seconds between two passes that make the recorded spans (the batch processor exports every 5 s).
FLUSH_S = 0.5
#: Spans kept waiting at most (the batch processor's own queue holds 2,048): more are dropped and counted.
MAX_PENDING = 8192


class _Pending:
    """One recorded span, until it is made."""

    __slots__ = ("attributes", "context", "end_ns", "error", "kind", "links", "name", "start_ns", "tracer")

    def __init__(
        self,
        tracer: trace.Tracer,
        name: str,
        context: otel_context.Context,
        kind: SpanKind,
        attributes: dict[str, Any],
        links: Sequence[Link],
        start_ns: int | None,
    ) -> None:
        self.tracer = tracer
        self.name = name
        self.context = context
        self.kind = kind
        self.attributes = attributes
        self.links = links
        self.start_ns = time.time_ns() if start_ns is None else start_ns
        self.end_ns = 0
        self.error: BaseException | None = None


class Deferred:
    """The recorded spans of one process and the thread that makes them."""

    def __init__(self, flush_s: float = FLUSH_S, max_pending: int = MAX_PENDING) -> None:
        self.pending: collections.deque[_Pending] = collections.deque()
        self.flush_s = flush_s
        self.max_pending = max_pending
        self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Make the recorded spans every ``flush_s`` in a daemon thread, and the last ones at exit."""
        self._thread = threading.Thread(target=self._run, name="corral-deferred-spans", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Make what is recorded now and stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.flush()

    def add(self, span: _Pending) -> None:
        """Keep a finished span for the next pass (dropped, and counted, beyond ``max_pending``)."""
        if len(self.pending) >= self.max_pending:
            self.dropped += 1
            return
        self.pending.append(span)

    def flush(self) -> int:
        """Make every recorded span an SDK span; how many were made."""
        made = 0
        while True:
            try:
                rec = self.pending.popleft()
            except IndexError:
                return made
            span = rec.tracer.start_span(
                rec.name,
                context=rec.context,
                kind=rec.kind,
                attributes=rec.attributes,
                links=rec.links,
                start_time=rec.start_ns,
            )
            if rec.error is not None:
                # As the SDK's own span does for an exception that leaves its block.
                span.record_exception(rec.error, timestamp=rec.end_ns, escaped=True)
                span.set_status(Status(StatusCode.ERROR, f"{type(rec.error).__name__}: {rec.error}"))
            span.end(end_time=rec.end_ns)
            made += 1

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()


#: The process's recorder, set by ``enable`` (``telemetry.configure`` with an OTLP target); None: none.
current: Deferred | None = None


def enable() -> Deferred:
    """Record deferred spans in this process from now on (and start making them)."""
    global current
    if current is None:
        current = Deferred()
        current.start()
    return current


class _Recording:
    """The ``with`` block of one deferred span: its attributes dict is the block's to add to."""

    __slots__ = ("deferred", "span")

    def __init__(self, deferred: Deferred | None, span: _Pending | None) -> None:
        self.deferred = deferred
        self.span = span

    def __enter__(self) -> dict[str, Any]:
        return self.span.attributes if self.span is not None else {}

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.deferred is None or self.span is None:
            return
        self.span.end_ns = time.time_ns()
        self.span.error = error
        self.deferred.add(self.span)


class DeferredTracer:
    """Deferred spans under one instrumentation scope (a module's name, as ``trace.get_tracer``)."""

    def __init__(
        self, name: str, deferred: Deferred | None = None, provider: trace.TracerProvider | None = None
    ) -> None:
        self.name = name
        self._deferred = deferred  # a recorder of its own (tests); else the process's ``current``
        self._given = provider  # a provider of its own (tests); else the global one
        self._tracer: trace.Tracer | None = None
        self._provider: trace.TracerProvider | None = None

    def span(
        self,
        name: str,
        *,
        context: otel_context.Context,
        attributes: dict[str, Any] | None = None,
        links: Sequence[Link] = (),
        kind: SpanKind = SpanKind.INTERNAL,
        start_ns: int | None = None,
    ) -> _Recording:
        """A span from the block's start (or ``start_ns``, ``time.time_ns()`` earlier) to its end, made
        later; ``with`` gives its attributes to add to.

        ``context`` is the parent (``telemetry.extract``: a job's traceparent, or the root)."""
        deferred = self._deferred or current
        if deferred is None:
            return _Recording(None, None)
        attrs = dict(attributes) if attributes else {}
        return _Recording(deferred, _Pending(self._tracer_now(), name, context, kind, attrs, links, start_ns))

    def _tracer_now(self) -> trace.Tracer:
        provider = self._given or trace.get_tracer_provider()
        if self._tracer is None or provider is not self._provider:
            self._tracer, self._provider = provider.get_tracer(self.name), provider
        return self._tracer
