"""Benchmark: what tracing and metrics cost a submit and a job's start, on vs off, side by side in one run.

Usage: ``python bench/observability.py [--jobs 200]``. Starts three local clusters (2 nodes x 4 GPUs each) in
temporary state directories, at the same time, on this machine:

- **on**: every process serves its Prometheus metrics (``corral up``'s default; a scraper reads every
  endpoint once a second, fifteen times Prometheus' default rate) and exports its spans over OTLP/HTTP
  (``OTEL_EXPORTER_OTLP_ENDPOINT`` set to a receiver in a child process, which answers 200 to any POST and
  counts the requests and their spans by path, so the result also says where the spans went);
- **metrics**: the metrics (scraped the same way), no OTLP endpoint: what the metrics alone cost;
- **off**: ``--metrics-port off`` (no endpoint, nothing recorded) and no OTLP endpoint;
- **off 2** (``--control``): a second **off**, whose change against **off** is the measurement's noise.

Then ``--jobs`` rounds, each of one one-GPU job on every cluster in turn (the order rotates, so none always
goes first): the submit request is sent and timed as sbatch sends it (``corral.api.v1.submit.<user>``
request/reply, measured in this process: the round trip, without a command's start-up), then the bench
waits until the job has ended, so each cluster is idle at each submit. Submit -> start is
``RunStarted.occurred_at - JobSubmitted.occurred_at`` from each cluster's log, as in ``bench/latency.py``.

Then ``--commands`` more rounds, each job submitted with the ``sbatch`` command as a user runs it (a
subprocess, through its cluster's command server, timed from start to exit), as a user sees a submit.

Also prints each process's CPU time per job during the rounds, by cluster (where the extra work goes).
Prints Markdown tables; results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import getpass
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from multiprocessing.connection import Connection as Pipe
from pathlib import Path

from latency import latencies  # bench/ is this script's directory: on sys.path
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.nats_request import Connection
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import decode, encode

SCRIPT = "#!/bin/sh\ntrue\n"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


class Receiver:
    """An OTLP/HTTP receiver in a process of its own (its decoding must not share the GIL of the process that
    times the submits): 200 to any POST, requests and decoded spans counted by path, and the spans by
    service and name (the name's first word: ``append``, ``run`` ...)."""

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.spans: collections.Counter[str] = collections.Counter()
        self.names: collections.Counter[str] = collections.Counter()
        context = multiprocessing.get_context("spawn")
        self.pipe, child = context.Pipe()
        self.process = context.Process(target=_receive, args=(child,), daemon=True)
        self.process.start()
        self.url = f"http://127.0.0.1:{self.pipe.recv()}"

    def stop(self) -> None:
        """Stop serving; the counts are then in ``requests`` and ``spans``."""
        if self.process.is_alive() and not self.pipe.closed:
            self.pipe.send("stop")
            requests, spans, names = self.pipe.recv()
            self.requests.update(requests)
            self.spans.update(spans)
            self.names.update(names)
            self.pipe.close()
        self.process.join(10)


def _receive(pipe: Pipe) -> None:
    """The receiver's process: serve until told to stop, then send back the counts."""
    requests: collections.Counter[str] = collections.Counter()
    spans: collections.Counter[str] = collections.Counter()
    names: collections.Counter[str] = collections.Counter()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            requests[self.path] += 1
            try:
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    service = next(
                        (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "?"
                    )
                    for scope in rs.scope_spans:
                        spans[self.path] += len(scope.spans)
                        names.update(f"{service} {span.name.split()[0]}" for span in scope.spans)
            except Exception:
                spans[f"{self.path} (undecodable)"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pipe.send(server.server_port)
    pipe.recv()
    server.shutdown()
    server.server_close()
    pipe.send((dict(requests), dict(spans), dict(names)))


class Scraper:
    """Reads every metrics endpoint once a second until stopped."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.scrapes = 0
        self.bytes = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        """Scrape each endpoint every second."""
        while not self.stopped.wait(1.0):
            for url in self.urls:
                with urllib.request.urlopen(url, timeout=5) as reply:
                    self.bytes += len(reply.read())
                self.scrapes += 1

    def stop(self) -> None:
        """Stop scraping."""
        self.stopped.set()
        self.thread.join()


class Submitter:
    """Submits one-GPU jobs to one cluster as its user and waits for them, over one connection."""

    def __init__(self, cluster: LocalCluster, workdir: Path) -> None:
        creds = read_credentials(cluster.user_credentials)
        self.user = creds.user
        self.workdir = workdir
        inbox = subjects.inbox_prefix(creds.user)
        self.conn = Connection(creds.url, user=creds.user, password=creds.password, inbox_prefix=inbox)
        self.submit_s: list[float] = []
        self.sbatch_s: list[float] = []
        self.job_ids: list[int] = []

    def call(self, verb: str, body: api.Request) -> bytes:
        """One request's reply."""
        return self.conn.request(subjects.api_subject(verb, self.user), encode(body), timeout=10.0).data

    def sbatch_and_wait(self, env: dict[str, str]) -> None:
        """Submit one job with ``sbatch`` as a user runs it (timed), then wait until it has ended."""
        started = time.perf_counter()
        out = subprocess.run(
            [str(Path(sys.executable).parent / "sbatch"), "--parsable", "--gres=gpu:1"],
            input=SCRIPT.encode(),
            env=env,
            cwd=self.workdir,
            capture_output=True,
            check=True,
        )
        self.sbatch_s.append(time.perf_counter() - started)
        self.wait_ended(int(out.stdout.decode().strip().split(";")[0]))

    def submit_and_wait(self) -> None:
        """Submit one job (timed), then wait until it has ended."""
        spec = ev.JobSpec(name="bench", script=SCRIPT, workdir=str(self.workdir), gpus_per_node=1)
        request = api.SubmitRequest(token=uuid.uuid4().hex, spec=spec)
        started = time.perf_counter()
        raw = self.call("submit", request)
        self.submit_s.append(time.perf_counter() - started)
        reply = decode(raw, api.SubmitReply | api.ApiError)
        if isinstance(reply, api.ApiError):
            raise RuntimeError(f"submit refused: {reply.error}")
        self.job_ids.append(reply.job_id)
        self.wait_ended(reply.job_id)

    def wait_ended(self, job_id: int) -> None:
        """Until the job has ended (60 s at most)."""
        query = api.JobsRequest(job_ids=[job_id], include_finished=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = decode(self.call("jobs", query), api.JobsReply | api.ApiError)
            if isinstance(jobs, api.JobsReply) and jobs.jobs and jobs.jobs[0].state in ENDED:
                return
            time.sleep(0.02)
        raise RuntimeError(f"job {job_id} did not end in 60 s")


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def rows(name: str, by_config: dict[str, list[float]]) -> str:
    """One metric's lines, a line per configuration, in ms, with the change of the median and the mean
    from ``off``."""
    off = [x * 1000 for x in by_config["off"]]
    lines = []
    for config, values in by_config.items():
        ms = [x * 1000 for x in values]
        change = "| | |"
        if config != "off":
            median = statistics.median(ms) / statistics.median(off) - 1
            mean = statistics.mean(ms) / statistics.mean(off) - 1
            change = f"| {median:+.1%} | {mean:+.1%} |"
        lines.append(
            f"| {name} | {config} | {len(ms)} | {statistics.median(ms):.2f} | {statistics.mean(ms):.2f} | "
            f"{pct(ms, 95):.2f} | {pct(ms, 99):.2f} {change}"
        )
    return "\n".join(lines)


def command_env(cluster: LocalCluster, root: Path) -> dict[str, str]:
    """The environment of a user's commands on ``cluster``: its state directory, and a command server of
    its own (one per cluster, under the bench's directory)."""
    runtime = root / f"runtime-{cluster.state_dir.name}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OTEL_"))}
    return {**env, "CORRAL_STATE_DIR": str(cluster.state_dir), "XDG_RUNTIME_DIR": str(runtime)}


def cpu_s(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds (user + system) each of the cluster's processes has used so far, NATS included (the
    postmaster's children are separate processes and are not counted)."""
    tick = os.sysconf("SC_CLK_TCK")
    pids = {p.name: p.proc.pid for p in cluster.processes if p.proc is not None}
    if cluster.nats is not None and cluster.nats.pid is not None:
        pids["nats-server"] = cluster.nats.pid
    used = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return used


def cpu_rows(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], jobs: int) -> str:
    """CPU ms per job of each process, by cluster, and each cluster's total."""
    names = sorted({n for used in after.values() for n in used})
    lines = ["| process | " + " | ".join(after) + " |", "|---|" + "---|" * len(after)]
    totals = dict.fromkeys(after, 0.0)
    for name in names:
        cells = []
        for config, used in after.items():
            if name not in used:
                cells.append("")
                continue
            ms = (used[name] - before[config].get(name, 0.0)) * 1000 / jobs
            totals[config] += ms
            cells.append(f"{ms:.2f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| total | " + " | ".join(f"{t:.2f}" for t in totals.values()) + " |")
    return "\n".join(lines)


def start(root: Path, name: str, *, metrics: bool, otlp: str | None) -> LocalCluster:
    """A started local cluster in ``root/name``; ``otlp``: the services' OTLP endpoint, or none."""
    cluster = LocalCluster(root / name, getpass.getuser(), nodes=2, gpus_per_node=4, metrics=metrics)
    config = cluster.prepare()
    ensure_resolvable([n.name for n in config.nodes])
    # The services' environment is this process's at their start (local_cluster passes it on).
    saved = os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if otlp is not None:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp
    try:
        cluster.start()
    finally:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
        if saved is not None:
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = saved
    return cluster


def main() -> int:
    """Run the benchmark and print the results."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200, help="jobs submitted to each cluster")
    parser.add_argument(
        "--commands", type=int, default=50, help="sbatch commands run for each cluster after the rounds"
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="a fourth cluster configured as off ('off 2'): its change against off is the noise floor",
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-bench-obs-"))
    work = root / "work"
    work.mkdir()
    receiver = Receiver()
    clusters: list[LocalCluster] = []
    scraper = None
    try:
        by_name: dict[str, LocalCluster] = {}
        configs = [("on", True, receiver.url), ("metrics", True, None), ("off", False, None)]
        if args.control:
            configs.append(("off 2", False, None))
        for name, metrics, otlp in configs:
            by_name[name] = start(root, name, metrics=metrics, otlp=otlp)
            clusters.append(by_name[name])
        scraped = [url for name in ("on", "metrics") for url in by_name[name].metrics_urls.values()]
        scraper = Scraper(scraped)
        submitters = {name: Submitter(cluster, work) for name, cluster in by_name.items()}
        for _ in range(3):  # warm every cluster up (first-use costs: connections, caches)
            for s in submitters.values():
                s.submit_and_wait()
        for s in submitters.values():
            s.submit_s.clear()
            s.job_ids.clear()
        names = list(submitters)
        before = {name: cpu_s(cluster) for name, cluster in by_name.items()}
        for i in range(args.jobs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                submitters[name].submit_and_wait()
        after = {name: cpu_s(cluster) for name, cluster in by_name.items()}
        envs = {name: command_env(cluster, root) for name, cluster in by_name.items()}
        for name in names:  # each cluster's command server starts with its first command
            submitters[name].sbatch_and_wait(envs[name])
            submitters[name].sbatch_s.clear()
        for i in range(args.commands):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                submitters[name].sbatch_and_wait(envs[name])
        waits = {name: asyncio.run(latencies(by_name[name], s.job_ids)) for name, s in submitters.items()}
        time.sleep(6)  # the services' span batches (BatchSpanProcessor: every 5 s) reach the receiver
        print("| metric | observability | n | p50 | mean | p95 | p99 | p50 change | mean change |")
        print("|---|---|---|---|---|---|---|---|---|")
        print(rows("submit round trip (ms)", {name: s.submit_s for name, s in submitters.items()}))
        print(rows("submit -> start (ms)", waits))
        if args.commands:
            print(rows("sbatch command (ms)", {name: s.sbatch_s for name, s in submitters.items()}))
        print()
        print("CPU ms per job, by process (the rounds only):")
        print()
        print(cpu_rows(before, after, args.jobs))
        print()
        endpoints = len(scraped)
        print(f"metrics: {scraper.scrapes} scrapes of {endpoints} endpoints, {scraper.bytes} bytes")
        receiver.stop()  # its counts come back as it stops
        print(f"OTLP receiver: requests by path {dict(receiver.requests)}")
        print(f"OTLP receiver: spans by path {dict(receiver.spans)}")
        jobs = args.jobs + 3  # and the warm-up's
        per_job = ", ".join(f"{name} {n / jobs:.1f}" for name, n in sorted(receiver.names.items()))
        print(f"OTLP receiver: spans per job by service and name: {per_job}")
        return 0
    finally:
        if scraper is not None:
            scraper.stop()
        for cluster in clusters:
            cluster.stop()
        receiver.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
