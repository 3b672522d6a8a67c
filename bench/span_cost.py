"""What the gateway's span work costs one submit, in-process: no NATS, no cluster.

Each iteration is the tracing the gateway does for one ``submit`` request, with the same calls:
``telemetry.attached`` (the API server, from the request's ``traceparent`` header), the ``submit`` span
with its attributes, ``telemetry.inject``, ``telemetry.about_job`` and the bus's ``append JobSubmitted``
span (``telemetry.extract`` of the job's traceparent, its attributes). Modes, each in its own process so
that each has its own global tracer provider:

- ``export``: the provider ``telemetry.configure`` sets with an OTLP endpoint, exporting to a receiver in a
  child process (answers 200 to any POST), so the batch processor's thread encodes and POSTs for real;
- ``sdk``: an SDK provider with no span processor (what ``configure`` set before without an endpoint);
- ``off``: what ``configure`` sets with no endpoint now.

``--tracer`` times the tracer instead: the derivation and export of a one-GPU job's spans (submitted,
allocated, started, exited, completed: 6 derived spans), exporting after every entry that ends a span (what
the tracer did with one job at a time, each entry its own fetch) versus one export per 64 jobs (a paced
export, ``OTEL_BSP_SCHEDULE_DELAY``), to the same kind of receiver.

``--export`` times one small export (a one-span POST, as a quiet service's batch or a paced tracer's is)
with the SDK exporter's own session versus ``telemetry.span_exporter``'s.

The time per iteration includes the export thread's share of the GIL, since a 512-span batch is encoded
and POSTed about every 256 iterations (the queue fills faster than in a service, which exports on its
schedule); ``force_flush`` at the end is inside the timing. ``--profile`` prints the top of a cProfile of
the export mode's loop.

    python bench/span_cost.py [--n 20000] [--rounds 3] [--profile] [--tracer] [--export]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

from corral.libs.config.otlp import OtlpTarget

RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
s = HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""

HEADER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def run(mode: str, n: int, profile: bool) -> dict[str, float]:
    """Time ``n`` iterations in this process under ``mode``; microseconds per iteration."""
    from opentelemetry import trace

    from corral.libs.runtime import telemetry

    receiver = None
    target: OtlpTarget | None = None
    if mode == "export":
        receiver, target = receiver_target()
    if mode == "sdk":
        trace.set_tracer_provider(telemetry.provider("gateway", None))
        telemetry.configure("gateway", None)  # logging only: the provider is set already
    else:
        telemetry.configure("gateway", target)
    tracer = telemetry.tracer("corral.services.gateway.app")
    bus_tracer = telemetry.tracer("corral.libs.runtime.bus")

    def one(job_id: int, header: str | None) -> None:
        with (
            telemetry.attached(header),
            tracer.start_as_current_span("submit", attributes={"enduser.id": "alice"}) as span,
        ):
            span.set_attribute("corral.job.id", job_id)
            traceparent = telemetry.inject()
            with telemetry.about_job(job_id, traceparent):
                if traceparent is None:
                    return
                with bus_tracer.start_as_current_span(
                    "append job_submitted",
                    context=telemetry.extract(traceparent),
                    attributes={"messaging.destination.name": "corral.ev.job.1", "corral.actor": "gw"},
                ) as append:
                    append.set_attribute("messaging.message.id", f"submit:alice:{job_id}")
                    append.set_attribute("corral.log.seq", job_id)

    for i in range(500):  # warm up
        one(i, HEADER)
    provider = trace.get_tracer_provider()
    flush = getattr(provider, "force_flush", lambda: True)
    flush()
    out: dict[str, float] = {}
    for header_name, header in (("header", HEADER), ("no header", None)):
        started = time.perf_counter()
        cpu = time.process_time()
        if profile:
            prof = cProfile.Profile()
            prof.enable()
        for i in range(n):
            one(i, header)
        flush()
        if profile:
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(35)
        out[f"{header_name} wall"] = (time.perf_counter() - started) / n * 1e6
        out[f"{header_name} cpu"] = (time.process_time() - cpu) / n * 1e6
    if receiver is not None:
        receiver.kill()
        receiver.wait()
    return out


def receiver_target() -> tuple[subprocess.Popen[str], OtlpTarget]:
    """A receiver in a child process, and the target that names it."""
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    port = int(receiver.stdout.readline())
    return receiver, OtlpTarget(url=f"http://127.0.0.1:{port}/v1/traces", headers={})


def tracer_cost(jobs: int) -> dict[str, float]:
    """CPU microseconds per job of the tracer's derive + export, per entry versus in paced batches."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))
    from builders import allocated, exited, job  # type: ignore[import-not-found]

    from corral.libs.runtime import telemetry
    from corral.schemas import codec
    from corral.schemas import events as ev
    from corral.services.tracer import otel
    from corral.services.tracer.jobs import Jobs

    def log(job_id: int) -> list[ev.Envelope]:
        traceparent = f"00-{job_id:032x}-b7ad6b7169203331-01"
        bodies: list[ev.Event] = [
            ev.JobSubmitted(job_id=ev.JobId(job_id), user="alice", spec=job(gpus=1, nodes=1)),
            allocated(job_id, {"n1": [0]}),
            ev.RunStarted(job_id=job_id, attempt=0, node="n1", pid=7),
            exited(job_id, "n1"),
            ev.JobCompleted(job_id=ev.JobId(job_id), attempt=0),
        ]
        return [
            codec.envelope(b, actor="x", occurred_at=1e9 + i, traceparent=traceparent)
            for i, b in enumerate(bodies)
        ]

    receiver, target = receiver_target()
    exporter = telemetry.span_exporter(target)
    out: dict[str, float] = {}
    for name, per in (("per entry", 1), ("paced, 64 jobs an export", 64)):
        memory = Jobs()
        seq = 0
        cpu = time.process_time()
        pending = []
        for job_id in range(1, jobs + 1):
            for env in log(job_id):
                seq += 1
                spans = memory.add(seq, env)
                memory.commit()
                if per == 1 and spans:
                    otel.export(exporter, spans)
                pending += spans
            if per > 1 and job_id % per == 0:
                otel.export(exporter, pending)
                pending = []
        otel.export(exporter, pending if per > 1 else [])
        out[name] = (time.process_time() - cpu) / jobs * 1e6
    receiver.kill()
    receiver.wait()
    return out


def export_cost(n: int) -> dict[str, float]:
    """CPU microseconds per one-span export: the exporter's default session versus ``span_exporter``'s."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import ReadableSpan

    from corral.libs.runtime import telemetry

    spans: list[ReadableSpan] = []
    tracer_provider = telemetry.provider("gateway", None)
    with tracer_provider.get_tracer("t").start_as_current_span(
        "submit", attributes={"corral.job.id": 1}
    ) as s:
        assert isinstance(s, ReadableSpan)
    spans.append(s)
    receiver, target = receiver_target()
    exporters = {
        "default session": OTLPSpanExporter(endpoint=target.url),
        "span_exporter": telemetry.span_exporter(target),
    }
    out: dict[str, float] = {}
    for name, exporter in exporters.items():
        exporter.export(spans)
        cpu = time.process_time()
        for _ in range(n):
            exporter.export(spans)
        out[name] = (time.process_time() - cpu) / n * 1e6
    receiver.kill()
    receiver.wait()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tracer", action="store_true", help="time the tracer's derive + export per job")
    parser.add_argument("--export", action="store_true", help="time a one-span export's CPU")
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.export:
        for _ in range(args.rounds):
            costs = export_cost(args.n)
            print(
                f"export, n={args.n}, CPU us per 1-span POST: "
                + " | ".join(f"{k} {v:.0f}" for k, v in costs.items())
            )
        return 0
    if args.tracer:
        for _ in range(args.rounds):
            costs = tracer_cost(args.n)
            print(
                f"tracer, n={args.n} jobs, CPU us per job: "
                + " | ".join(f"{k} {v:.0f}" for k, v in costs.items())
            )
        return 0
    if args.mode:
        print(json.dumps(run(args.mode, args.n, args.profile)))
        return 0
    if args.profile:
        run("export", args.n, True)
        return 0
    results: dict[str, list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for mode in ("export", "sdk", "off"):
            done = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--n", str(args.n)],
                capture_output=True,
                text=True,
                check=True,
                env=os.environ,
            )
            results.setdefault(mode, []).append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"n={args.n} per round, {args.rounds} rounds; us per submit, median over rounds (min-max)")
    for mode, rounds in results.items():
        cells = []
        for key in rounds[0]:
            values = [r[key] for r in rounds]
            cells.append(f"{key} {statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})")
        print(f"{mode:7s} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
