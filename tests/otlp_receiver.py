"""A real OTLP/HTTP receiver for the tests: an HTTP server that takes POSTs on any path, records the path and
headers, and decodes the body with the official protobuf definitions (``opentelemetry-proto``).

It answers like a collector (200 with an empty ``ExportTraceServiceResponse``) on ``/v1/traces`` and 404
elsewhere, so an exporter that posts to the wrong path fails as it would against a real collector, and the
test sees the wrong path in ``requests``.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver decoded it."""

    service: str  # the resource's service.name
    name: str  # span name
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # 16 hex digits, "" for a root span
    start_ns: int  # start, ns since the epoch
    end_ns: int  # end
    attributes: dict[str, object]  # attribute values (str, int, float, bool or a list of them)
    events: list[tuple[str, dict[str, object]]]  # span events: (name, attributes)
    status: int  # status code (0 unset, 1 ok, 2 error)
    links: list[tuple[str, str]] = field(default_factory=list)  # linked spans: (trace id, span id)


@dataclass
class Request:
    """One POST the receiver got."""

    path: str  # the request path
    headers: dict[str, str]  # its headers, lower-case names
    body: bytes  # the raw (decompressed) body


@dataclass
class OtlpReceiver:
    """The server's address and what it received."""

    url: str  # base URL, http://127.0.0.1:PORT
    requests: list[Request] = field(default_factory=list)  # every POST, in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received on the traces path, in arrival order."""
        with self.lock:
            bodies = [r.body for r in self.requests if r.path == TRACES_PATH]
        return [span for body in bodies for span in decode(body)]

    def wait_for(self, predicate: object, timeout: float = 30.0) -> list[ReceivedSpan]:
        """The spans once ``predicate(spans)`` holds; AssertionError with what arrived after ``timeout``."""
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.service, s.name) for s in spans})
                raise AssertionError(f"spans not received in {timeout}s; got {names}")
            time.sleep(0.2)


def _value(any_value: object) -> object:
    """A protobuf AnyValue as a Python value."""
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]  # type: ignore[attr-defined]
    return getattr(any_value, kind) if kind else None


def _attributes(kvs: object) -> dict[str, object]:
    return {kv.key: _value(kv.value) for kv in kvs}  # type: ignore[attr-defined]


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ExportTraceServiceRequest body."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        events=[(e.name, _attributes(e.attributes)) for e in span.events],
                        status=span.status.code,
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                    )
                )
    return found


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if (self.headers.get("Content-Encoding") or "") == "gzip":
                raw = gzip.decompress(raw)
            headers = {k.lower(): v for k, v in self.headers.items()}
            with receiver.lock:
                receiver.requests.append(Request(self.path, headers, raw))
            if self.path != TRACES_PATH:
                self.send_response(404)
                self.end_headers()
                return
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the tests read ``requests``."""

    return Handler


def serve() -> Iterator[OtlpReceiver]:
    """Run a receiver on a free port of 127.0.0.1 until the generator is closed (a fixture's body)."""
    receiver = OtlpReceiver(url="")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
