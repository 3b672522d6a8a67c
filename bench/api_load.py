"""A concurrent API client for the throughput benchmarks: submissions from many in-flight requests on one NATS
connection, in one or several client processes.

Each client process opens one connection with the user's credentials and keeps ``in_flight`` requests
outstanding until it has sent its share: ``submit`` requests (one job each) or, with ``batch`` > 0,
``submit_batch`` requests of ``batch`` jobs each. A request's latency is from its send to its reply; a job
counts as submitted when its reply carries its id (the gateway replies once the log has stored the entry).
Every token is unique to its job, so the ids returned must be too.

Used by ``api_throughput.py`` and ``e2e_throughput.py``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import decode, encode

#: Seconds a client waits for one reply before it counts the request as failed.
TIMEOUT_S = 30.0


def trivial_spec(held: bool, workdir: str = "/tmp") -> ev.JobSpec:
    """A job that runs ``true`` on one CPU (``held``: submitted held, so that it never runs)."""
    return ev.JobSpec(
        name="bench",
        script="#!/bin/sh\ntrue\n",
        workdir=workdir,
        environment={"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8"},
        stdout="/dev/null",
        time_limit_s=60,
        held=held,
    )


@dataclass
class Load:
    """What to send."""

    jobs: int  # jobs in all, over every client
    clients: int = 1  # client processes, one connection each
    in_flight: int = 1  # requests outstanding per client
    batch: int = 0  # jobs per request: 0 = the submit verb, N = submit_batch with N jobs
    held: bool = True  # submit the jobs held (nothing runs: the API alone is measured)
    workdir: str = "/tmp"  # the jobs' submit directory


@dataclass
class ClientResult:
    """One client's outcome."""

    latencies: list[float] = field(default_factory=list)  # seconds per request
    ids: list[int] = field(default_factory=list)  # job ids replied
    errors: list[str] = field(default_factory=list)  # refusals and failures, one per job
    first_send: float = 0.0  # wall time of the first send
    last_reply: float = 0.0  # wall time of the last reply


@dataclass
class LoadResult:
    """Every client's outcome together."""

    load: Load
    latencies: list[float]  # seconds per request, every client
    ids: list[int]  # job ids, every client
    errors: list[str]  # one per job not submitted
    wall: float  # first send to last reply, over all clients

    @property
    def rate(self) -> float:
        """Jobs submitted per second."""
        return len(self.ids) / self.wall if self.wall > 0 else 0.0


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (nearest rank)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


async def _client(creds_path: str, load: Load, share: int, start_at: float) -> ClientResult:
    creds = read_credentials(Path(creds_path))
    nc = await connect(creds, name=f"bench-client-{os.getpid()}")
    result = ClientResult()
    spec = trivial_spec(load.held, load.workdir)
    per_request = max(load.batch, 1)
    requests = [min(per_request, share - i) for i in range(0, share, per_request)]
    subject = subjects.api_subject("submit_batch" if load.batch else "submit", creds.user)
    run = uuid.uuid4().hex[:12]
    counter = iter(range(10**9))
    single = api.SubmitReply | api.ApiError

    def body(size: int) -> bytes:
        jobs = [api.SubmitRequest(token=f"{run}-{next(counter)}", spec=spec) for _ in range(size)]
        if load.batch:
            return encode(api.SubmitBatchRequest(jobs=jobs))
        return encode(jobs[0])

    payloads = [body(size) for size in requests]  # encoded before the clock starts
    queue = list(reversed(payloads))
    await asyncio.sleep(max(0.0, start_at - time.time()))
    result.first_send = time.time()

    async def worker() -> None:
        while queue:
            payload = queue.pop()
            started = time.perf_counter()
            try:
                msg = await nc.request(subject, payload, timeout=TIMEOUT_S)
            except Exception as exc:  # a timeout or a lost connection: every job of the request failed
                result.errors.extend([repr(exc)] * max(load.batch, 1))
                continue
            result.latencies.append(time.perf_counter() - started)
            if load.batch:
                reply = decode(msg.data, api.SubmitBatchReply | api.ApiError)
                if isinstance(reply, api.ApiError):
                    result.errors.extend([reply.error] * load.batch)
                    continue
                for one in reply.results:
                    if isinstance(one, api.SubmitReply):
                        result.ids.append(one.job_id)
                    else:
                        result.errors.append(one.error)
            else:
                reply = decode(msg.data, single)
                if isinstance(reply, api.SubmitReply):
                    result.ids.append(reply.job_id)
                else:
                    result.errors.append(reply.error)

    await asyncio.gather(*(worker() for _ in range(load.in_flight)))
    result.last_reply = time.time()
    await nc.drain()
    return result


def _client_process(creds_path: str, load: Load, share: int, start_at: float) -> bytes:
    return msgspec.msgpack.encode(asyncio.run(_client(creds_path, load, share, start_at)))


def run_load(creds_path: Path, load: Load) -> LoadResult:
    """Send ``load`` from ``load.clients`` processes at once; every client's outcome."""
    shares = [
        load.jobs // load.clients + (1 if i < load.jobs % load.clients else 0) for i in range(load.clients)
    ]
    # Every client connects and encodes its requests first; they start sending together.
    start_at = time.time() + 1.0 + 0.3 * load.clients
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=load.clients, mp_context=ctx) as pool:
        futures = [pool.submit(_client_process, str(creds_path), load, s, start_at) for s in shares]
        results = [msgspec.msgpack.decode(f.result(), type=ClientResult) for f in futures]
    first = min(r.first_send for r in results)
    last = max(r.last_reply for r in results)
    return LoadResult(
        load=load,
        latencies=[x for r in results for x in r.latencies],
        ids=[x for r in results for x in r.ids],
        errors=[x for r in results for x in r.errors],
        wall=last - first,
    )
