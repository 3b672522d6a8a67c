"""Benchmark: rebuilding the scheduler's state from 1,000,000 log entries, with and without a snapshot.

    python bench/rebuild.py [--small] [--before DIR] [--rounds N] [--profile] [--child-timeout 600]

The log is 10,000 node registrations and 990,000 submissions of jobs that stay pending
(``--small``: 1,000 + 99,000), built by ``backfill_pass.py``'s builders (a ~350-byte script and a
16-variable exported environment per job; each entry ~1.3 KB of JSON), with deterministic ids and
times. Steps, each measured on its own:

(a), (b) in this process (``rebuild_steps.py``): the full and the slim decode, the fold, the snapshot's
    encode and decode;
(c) a real nats-server (JetStream, file storage) in a temporary directory: append the whole log
    (``publish_async`` with ``Nats-Msg-Id``, pipelined), read it without folding three ways
    (``rebuild_steps.read_steps``), then start fresh scheduler processes as a restart would: one runs
    ``Scheduler.rebuild(use_snapshot=False)`` (from the log) and then ``snapshot.save``, the next
    ``Scheduler.rebuild()`` (from that snapshot); between them one only reads and decodes the snapshot
    object, for comparison. Each reports its wall time and peak RSS (VmHWM). With ``--before DIR`` (a
    checkout of the code before, e.g. ``git archive main | tar -x -C DIR``) every start runs twice, the
    before's (its services import Corral from DIR) right before the after's, on the same log and server
    (each format keeps its own snapshot name). A start that runs past ``--child-timeout`` is stopped and
    reported as such. ``--rounds N`` starts each kind N times, the before's and the after's in alternating
    order (on this project's VM the first of two fresh processes paid up to 1.5 s more kernel time).

Issue targets: rebuild from 1,000,000 events <= 10 s from the log, <= 1 s from a snapshot; scheduler RSS
with 1,000,000 pending jobs <= 2 GiB. ``--profile`` profiles the rebuild from the log (cProfile, top
functions by own time; slower). The server is always stopped and its directory deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import inspect
import io
import json
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from backfill_pass import machine, profile_text
from cluster_workload import (
    DAY,
    NOW,
    config_text,
    layout,
    meta,
    node_registrations,
    pending_job,
)

from corral.libs.config.cluster import parse_config
from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.schemas.codec import encode
from corral.services.scheduler import snapshot
from corral.services.scheduler.app import Scheduler

PASSWORD_ENV = "CORRAL_BENCH_NATS_PASSWORD"
MIB = 2**20

#: One log entry ready to append: (subject, Nats-Msg-Id, JSON bytes).
Entry = tuple[str, str, bytes]


def log_entries(n_events: int, n_nodes: int, seed: int = 2) -> Iterator[Entry]:
    """Node registrations, then submissions of pending jobs, one second apart at most."""
    for i, body in enumerate(node_registrations(n_nodes)):
        env = ev.Envelope(meta=meta(i + 1, NOW - 3 * DAY, "agent"), body=body)
        yield subjects.event_subject(body), env.meta.event_id, encode(env)
    rng = random.Random(seed)
    parts = layout(n_nodes)
    n_jobs = n_events - n_nodes
    for k in range(n_jobs):
        seq, job_id = n_nodes + k + 1, k + 1
        user, spec = pending_job(rng, k, parts)
        submitted = ev.JobSubmitted(job_id=job_id, user=user, spec=spec)
        at = NOW - DAY + k * (DAY / n_jobs)
        env = ev.Envelope(
            meta=ev.Meta(
                event_id=f"{seq:032x}",
                occurred_at=at,
                actor=user,
                correlation_id=str(job_id),
                traceparent=f"00-{rng.getrandbits(128):032x}-{rng.getrandbits(64):016x}-01",
            ),
            body=submitted,
        )
        yield subjects.event_subject(submitted), env.meta.event_id, encode(env)


async def append_log(creds: Credentials, entries: list[Entry], window: int = 10_000) -> float:
    """Declare the streams and append every entry, pipelined; the wall time."""
    nc = await connect(creds, name="bench-append")
    try:
        await declare(nc.jetstream())
        js = nc.jetstream(timeout=30.0, publish_async_max_pending=window)
        started = time.perf_counter()
        batch: list[asyncio.Future[Any]] = []
        for subject, msg_id, data in entries:
            batch.append(await js.publish_async(subject, data, headers={"Nats-Msg-Id": msg_id}))
            if len(batch) >= 5 * window:
                await _acked(batch)
                batch = []
        await _acked(batch)
        wall = time.perf_counter() - started
        last = await Bus(nc, actor="bench").last_seq()
        assert last == len(entries), f"the log has {last} entries, expected {len(entries)}"
        return wall
    finally:
        await nc.close()


async def _acked(batch: list[asyncio.Future[Any]]) -> None:
    acks = await asyncio.gather(*batch)
    duplicates = sum(bool(ack.duplicate) for ack in acks)
    assert duplicates == 0, f"{duplicates} appends were duplicates"


def rss_mib(field: str = "VmRSS") -> float:
    """Current resident set size (MiB); ``VmHWM``: its peak since this program was exec'd.

    (``getrusage``'s ru_maxrss of a child process also counts its parent's size at fork.)
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


async def child(mode: str, url: str, n_nodes: int, profile: bool) -> dict[str, Any]:
    """One scheduler start in a fresh process.

    ``log``: rebuild from the log, then save a snapshot; ``snapshot``: rebuild from it;
    ``snapshot-parts``: only read the snapshot object (linearly, into a file object) and decode it.
    """
    creds = Credentials(url=url, user=roles.ADMIN, password=os.environ[PASSWORD_ENV])
    nc = await connect(creds, name=f"bench-rebuild-{mode}")
    try:
        bus = Bus(nc, actor="bench")
        if mode == "snapshot-parts":
            return await snapshot_parts(bus)
        scheduler = Scheduler(bus, parse_config(config_text(n_nodes)))
        out: dict[str, Any] = {}
        profiler = cProfile.Profile() if profile else None
        started, cpu, times = time.perf_counter(), time.process_time(), os.times()
        if profiler is not None:
            profiler.enable()
        await scheduler.rebuild(use_snapshot=mode == "snapshot")
        if profiler is not None:
            profiler.disable()
            out["profile"] = profile_text(profiler, "tottime", 12)
            out["profile_cum"] = profile_text(profiler, "cumulative", 12)
        out["wall"] = time.perf_counter() - started
        out["cpu"] = time.process_time() - cpu
        out["cpu_sys"] = os.times().system - times.system
        out["peak_rss_mib"] = rss_mib("VmHWM")
        out["rss_mib"] = rss_mib()
        out["last_seq"] = scheduler.state.last_seq
        out["jobs"] = len(scheduler.state.jobs)
        out["from_snapshot"] = scheduler.snapshot_seq
        if mode == "log":
            started = time.perf_counter()
            out["snapshot_bytes"] = await snapshot.save(bus, scheduler.state)
            out["save_wall"] = time.perf_counter() - started
        return out
    finally:
        await nc.close()


async def snapshot_parts(bus: Bus) -> dict[str, Any]:
    """Time the parts of a snapshot load: reading the object and decoding it (either format's code), with
    the cyclic GC paused as a rebuild runs."""
    gc.disable()
    started = time.perf_counter()
    if hasattr(snapshot, "read"):  # format 4: the bulk reader, then an async decode
        data: Any = await snapshot.read(bus)
    else:
        store = await bus.js.object_store(subjects.SNAPSHOT_BUCKET)
        buffer = io.BytesIO()
        await store.get(snapshot.NAME, writeinto=buffer)
        data = buffer.getbuffer()
    read = time.perf_counter() - started
    started = time.perf_counter()
    snap = snapshot.decode(data)
    if inspect.isawaitable(snap):
        snap = await snap
    decode = time.perf_counter() - started
    return {"read": read, "decode": decode, "bytes": len(data), "jobs": len(snap.state.jobs)}


def run_child(
    mode: str, url: str, password: str, n_nodes: int, profile: bool, timeout: float, checkout: str | None
) -> dict[str, Any]:
    """Run ``child`` in a fresh interpreter (importing Corral from ``checkout``, if given); its result, or
    {"error": ...}."""
    argv = [sys.executable, __file__, "--child", mode, "--url", url, "--nodes", str(n_nodes)]
    env = {**os.environ, PASSWORD_ENV: password}
    if checkout is not None:
        env["PYTHONPATH"] = checkout
    try:
        proc = subprocess.run(
            [*argv, *(["--profile"] if profile else [])],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"stopped after {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def server_steps(
    entries: list[Entry], n_nodes: int, args: argparse.Namespace
) -> tuple[list[Any], dict[str, Any]]:
    """(c) append to a real log, read it, then restart from it and from a snapshot (before and after);
    the rows and the after's log rebuild's result."""
    from bench_clusters import cpu_seconds
    from rebuild_steps import load, read_steps

    password = secrets.token_hex(16)
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-rebuild-"))
    server = NatsServer(tmp / "nats", [roles.service_user(roles.ADMIN, password)])
    n = len(entries)
    rows: list[Any] = []
    from_log: dict[str, Any] = {}
    runs = [("before", args.before), ("after", None)] if args.before else [("after", None)]
    try:
        server.start()
        assert server.pid is not None
        creds = Credentials(url=server.url, user=roles.ADMIN, password=password)
        print("  appending", file=sys.stderr, flush=True)
        wall = asyncio.run(append_log(creds, entries))
        rows.append(("(c) append to the log", wall, f"{n / wall:,.0f}/s", -1, f"publish_async; {load()}"))
        store = sum(f.stat().st_size for f in (tmp / "nats").rglob("*") if f.is_file())
        rows += asyncio.run(read_steps(creds, n, server.pid))
        for mode, r in ((m, r) for m in ("log", "snapshot-parts", "snapshot") for r in range(args.rounds)):
            # The after's first save deletes the snapshots of older formats: it saves first. Later rounds
            # alternate the order: on this VM the first of two fresh processes pays more kernel time.
            first = reversed(runs) if mode == "log" else runs
            for label, checkout in reversed(list(first)) if r % 2 else first:
                print(f"  child {mode} ({label}, round {r + 1})", file=sys.stderr, flush=True)
                cpu = cpu_seconds(server.pid)
                res = run_child(
                    mode,
                    server.url,
                    password,
                    n_nodes,
                    args.profile and mode == "log" and label == "after",
                    args.child_timeout,
                    checkout,
                )
                cpu = cpu_seconds(server.pid) - cpu
                step = f"(c) {label}: rebuild from the {mode}"
                step += f" (round {r + 1})" if args.rounds > 1 else ""
                if "error" in res:
                    rows.append((step, -1, "stopped", -1, res["error"].replace("\n", " ")[-300:]))
                    continue
                if mode == "snapshot-parts":
                    note = (
                        f"read {res['read']:.2f} s + decode {res['decode']:.2f} s"
                        f" ({res['bytes'] / MIB:,.0f} MiB); {load()}"
                    )
                    rows.append((f"(c) {label}: snapshot parts", res["read"] + res["decode"], "", -1, note))
                    continue
                note = (
                    f"fresh process: resident after {res['rss_mib']:,.0f} MiB ({res['jobs']:,} jobs,"
                    f" last_seq {res['last_seq']:,}, snapshot seq {res['from_snapshot']:,});"
                    f" CPU: the scheduler {res['cpu']:.2f} s ({res.get('cpu_sys', -1):.2f} in the kernel),"
                    f" nats-server {cpu:.2f} s"
                )
                if mode == "log":
                    note += f"; JetStream store {store / MIB:,.0f} MiB"
                rows.append(
                    (step, res["wall"], f"{n / res['wall']:,.0f}/s", res["peak_rss_mib"], f"{note}; {load()}")
                )
                if mode == "log":
                    if label == "after":
                        from_log = res
                    size = res["snapshot_bytes"] / MIB
                    rows.append((f"(c) {label}: snapshot.save", res["save_wall"], "", -1, f"{size:,.0f} MiB"))
        return rows, from_log
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    """Run the benchmark (or, with --child, one scheduler start) and print the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="100,000 events (1,000 nodes)")
    parser.add_argument("--before", help="a checkout of the code before, to start schedulers from as well")
    parser.add_argument("--profile", action="store_true", help="profile the rebuild from the log")
    parser.add_argument(
        "--rounds", type=int, default=1, help="starts of each kind, before and after in alternating order"
    )
    parser.add_argument(
        "--child-timeout", type=float, default=600.0, help="seconds before a scheduler start is stopped"
    )
    parser.add_argument("--child", choices=("log", "snapshot", "snapshot-parts"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = asyncio.run(child(args.child, args.url, args.nodes, args.profile))
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    from rebuild_steps import fold_steps, load

    n_events, n_nodes = (100_000, 1_000) if args.small else (1_000_000, 10_000)
    print(f"## rebuild: {n_events:,} events ({n_nodes:,} nodes, {n_events - n_nodes:,} pending jobs)\n")
    print(f"Machine: {machine()}; {load()} at the start\n")
    started = time.perf_counter()
    entries = list(log_entries(n_events, n_nodes))
    wall = time.perf_counter() - started
    rows: list[Any] = [("build + encode the log", wall, f"{n_events / wall:,.0f}/s", -1, "")]
    rows += fold_steps(entries)
    more, from_log = server_steps(entries, n_nodes, args)
    rows += more
    print("| step | wall s | rate | peak RSS MiB | notes |\n|---|---|---|---|---|")
    for step, wall, rate, rss, note in rows:
        print(
            f"| {step} | {'-' if wall < 0 else f'{wall:.2f}'} | {rate}"
            f" | {'-' if rss < 0 else f'{rss:,.0f}'} | {note} |"
        )
    print(
        f"\nTargets at 1,000,000 events: rebuild from the log <= 10 s, from a snapshot <= 1 s;"
        f" scheduler RSS with 1,000,000 pending jobs <= 2 GiB. {load()} at the end."
    )
    if "profile" in from_log:
        print(f"\ncProfile of the rebuild from the log, by own time:\n\n```\n{from_log['profile']}\n```")
        print(f"\nBy cumulative time:\n\n```\n{from_log['profile_cum']}\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
