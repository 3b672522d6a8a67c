"""Prometheus metrics of one service process: its own registry, the families every service shares, the HTTP
endpoint that serves them.

- ``Metrics()`` holds a ``CollectorRegistry`` of its own (never the library's global one, so two
  services in one test process never mix their numbers) and the shared families:
  - ``corral_log_appends_total{event}``: appends to the log by event type (``Bus.append``; ``rate()`` gives
    appends per second);
  - ``corral_dead_letters_total{service,reason}``: messages and log entries dead-lettered, by a bounded
    reason (``rejected``: a consumer's handler refused a message; ``skipped_entry``: a reader skipped a log
    entry it could not fold);
  - ``corral_consumer_pending_messages{stream,consumer}`` and ``corral_consumer_ack_pending_messages``:
    each durable consumer's lag (JetStream's ``num_pending``: stored and not yet delivered) and what it holds
    unacknowledged, polled by the consuming process (``Bus.consume``);
  - ``corral_api_request_duration_seconds{verb}`` and ``corral_api_errors_total{verb,code}``: every API
    request a process serves, and those answered with an error (``api_server.serve``).
- A service's own families (the scheduler's queue and GPU gauges, the agent's launches) are made on
  ``Metrics.registry`` by that service (``services/<name>/metrics.py``).
- ``Snapshot`` is a gauge family replaced whole: a cycle computes every sample from the state and swaps them
  in at once, so a scrape never sees half a cycle, and a label set that is gone (a partition with nothing
  pending) disappears instead of keeping its last value.
- ``serve(metrics, host, port)`` starts prometheus-client's HTTP server in a daemon thread (port 0: a free
  one); the returned ``Endpoint`` names its URL and stops it.

``current`` is the process's ``Metrics`` for the code that serves requests (``api_server.serve``): set by
``service.run`` before a service's ``main`` starts, None in a process (or a test) that exports none.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

#: Buckets of request and cycle durations: 0.5 ms to 10 s.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Buckets of waits that may last from milliseconds to days (submit -> start).
WAIT_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0,
    86400.0, 7 * 86400.0,
)  # fmt: skip

#: Dead-letter reasons (the ``reason`` label is one of these, never free text).
REJECTED = "rejected"
SKIPPED_ENTRY = "skipped_entry"
FOREIGN_REPLY = "foreign_reply"


class Snapshot(Collector):
    """A gauge family whose samples are replaced whole at each ``set``."""

    def __init__(
        self, name: str, documentation: str, labels: Iterable[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = list(labels)
        self._samples: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def set(self, samples: Mapping[tuple[str, ...], float]) -> None:
        """Replace every sample (label values in ``labels`` order -> value); one assignment, so atomic."""
        self._samples = dict(samples)

    def describe(self) -> Iterable[Metric]:
        """The family without samples (for the registry's duplicate-name check)."""
        return [GaugeMetricFamily(self.name, self.documentation, labels=self.labels)]

    def collect(self) -> Iterable[Metric]:
        """The family with the latest samples."""
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, value in self._samples.items():
            family.add_metric(list(key), value)
        return [family]


class Metrics:
    """The metrics of one service process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.appends = Counter(
            "corral_log_appends", "Events appended to the log, by event type", ["event"], registry=r
        )
        self.dead_letters = Counter(
            "corral_dead_letters", "Messages and log entries dead-lettered", ["service", "reason"], registry=r
        )
        self.consumer_pending = Gauge(
            "corral_consumer_pending_messages",
            "Messages of a durable consumer's stream not yet delivered to it (its lag)",
            ["stream", "consumer"],
            registry=r,
        )
        self.consumer_ack_pending = Gauge(
            "corral_consumer_ack_pending_messages",
            "Messages delivered to a durable consumer and not yet acknowledged",
            ["stream", "consumer"],
            registry=r,
        )
        self.api_seconds = Histogram(
            "corral_api_request_duration_seconds",
            "Time to answer an API request, by verb",
            ["verb"],
            buckets=FAST_BUCKETS,
            registry=r,
        )
        self.api_errors = Counter(
            "corral_api_errors",
            "API requests answered with an error, by verb and code",
            ["verb", "code"],
            registry=r,
        )

    def appended(self, event: str) -> None:
        """Count one append of an event of type ``event`` (its tag)."""
        self.appends.labels(event).inc()

    def dead_lettered(self, service: str, reason: str) -> None:
        """Count one dead letter of ``service`` (``reason``: REJECTED, SKIPPED_ENTRY or
        FOREIGN_REPLY)."""
        self.dead_letters.labels(service, reason).inc()

    def consumer_lag(self, stream: str, consumer: str, pending: int, ack_pending: int) -> None:
        """Record a durable consumer's latest info."""
        self.consumer_pending.labels(stream, consumer).set(pending)
        self.consumer_ack_pending.labels(stream, consumer).set(ack_pending)

    def served(self, verb: str, seconds: float, error_code: str | None) -> None:
        """Record one API request answered in ``seconds`` (``error_code`` of an ApiError reply, else None)."""
        self.api_seconds.labels(verb).observe(seconds)
        if error_code is not None:
            self.api_errors.labels(verb, error_code).inc()


#: The process's metrics for the request servers (see the module docstring).
current: contextvars.ContextVar[Metrics | None] = contextvars.ContextVar("corral_metrics", default=None)


@dataclass
class Endpoint:
    """A running metrics HTTP server."""

    url: str  # where to scrape, http://host:port/metrics
    server: WSGIServer  # prometheus-client's server (its thread serves until ``stop``)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()


def serve(metrics: Metrics, host: str, port: int) -> Endpoint:
    """Serve ``metrics`` on ``host:port`` (0: a free port) over HTTP; OSError if it cannot bind."""
    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    bound = server.server_port
    shown = f"[{host}]" if ":" in host else host
    return Endpoint(url=f"http://{shown}:{bound}/metrics", server=server)
