"""Benchmark: rebuilding the scheduler's state from 1,000,000 log entries, with and without a snapshot.

    python bench/rebuild.py [--small] [--profile] [--child-timeout 600]

The log is 10,000 node registrations and 990,000 submissions of jobs that stay pending
(``--small``: 1,000 + 99,000), built by ``backfill_pass.py``'s builders (a ~350-byte script and a
16-variable exported environment per job; each entry ~1.4 KB of JSON), with deterministic ids and
times. Steps:

(a) the fold alone: decode every entry (``decode_envelope``) and fold the envelopes
    (``state.fold``), each with and without the cyclic GC, and the resident memory of the result;
(b) ``encode_state`` / ``decode_state`` of that state: snapshot size and time;
(c) a real nats-server (JetStream, file storage) in a temporary directory: append the whole log
    (``publish_async`` with ``Nats-Msg-Id``, pipelined), then start fresh scheduler processes as a
    restart would: one runs ``Scheduler.rebuild(use_snapshot=False)`` (from the log) and then
    ``snapshot.save``, the next ``Scheduler.rebuild()`` (from that snapshot); between them one
    only reads and decodes the snapshot object linearly, for comparison. Each reports its wall
    time and peak RSS (VmHWM) -- the scheduler's memory with every job pending. A start that runs
    past ``--child-timeout`` is stopped and reported as such.

Issue targets: rebuild from 1,000,000 events <= 10 s from the log, <= 1 s from a snapshot; scheduler RSS
with 1,000,000 pending jobs <= 2 GiB. ``--profile`` profiles the rebuild from the log (cProfile, top
functions by own time; slower). The server is always stopped and its directory deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
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

from backfill_pass import (
    machine,
    profile_text,
    row,
)
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
from corral.libs.core.fold import fold
from corral.libs.core.state import State, decode_state, encode_state
from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.schemas.codec import decode_envelope, encode
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


def rss_mib(field: str = "VmRSS") -> float:
    """Current resident set size (MiB); ``VmHWM``: its peak since this program was exec'd.

    (``getrusage``'s ru_maxrss of a child process also counts its parent's size at fork.)
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed(label: str, fn: Any, *args: Any) -> tuple[Any, float]:
    """(fn(*args), wall seconds); prints progress to stderr."""
    started = time.perf_counter()
    out = fn(*args)
    wall = time.perf_counter() - started
    print(f"  {label}: {wall:.2f} s, rss {rss_mib():,.0f} MiB", file=sys.stderr, flush=True)
    return out, wall


def decode_all(entries: list[Entry]) -> list[tuple[int, ev.Envelope]]:
    """Decode every entry, numbered from 1 as the log numbers them."""
    return [(seq, decode_envelope(data)) for seq, (_, _, data) in enumerate(entries, 1)]


def fold_steps(entries: list[Entry], rows: list[str]) -> None:
    """(a) decode and fold in memory; (b) snapshot encode/decode."""
    n = len(entries)
    base = rss_mib()
    decoded, wall = timed("decode", decode_all, entries)
    nbytes = sum(len(e[2]) for e in entries)
    note = f"{n:,} entries, {nbytes / MIB:,.0f} MiB of JSON ({nbytes / n:,.0f} B each)"
    note += f"; envelopes +{rss_mib() - base:,.0f} MiB"
    rows.append(row("(a) decode_envelope", f"{wall:.2f}", f"{n / wall:,.0f} events/s", note))
    del decoded
    gc.collect()
    gc.disable()
    try:
        decoded, wall = timed("decode, gc disabled", decode_all, entries)
    finally:
        gc.enable()
    note = "same entries, cyclic GC off during the decode"
    rows.append(row("(a) decode_envelope, gc disabled", f"{wall:.2f}", f"{n / wall:,.0f} events/s", note))

    gc.collect()
    before = rss_mib()
    state, wall = timed("fold", fold, decoded)
    note = f"{len(state.jobs):,} jobs, {len(state.nodes):,} nodes"
    note += f"; fold's own objects +{rss_mib() - before:,.0f} MiB"
    rows.append(row("(a) fold", f"{wall:.2f}", f"{n / wall:,.0f} events/s", note))

    del state
    gc.collect()
    gc.disable()
    try:
        state, wall = timed("fold, gc disabled", fold, decoded)
    finally:
        gc.enable()
    note = "same envelopes, cyclic GC off during the fold"
    rows.append(row("(a) fold, gc disabled", f"{wall:.2f}", f"{n / wall:,.0f} events/s", note))

    profiler = cProfile.Profile()
    sample = decoded[: min(n, 100_000)]
    profiler.runcall(fold, sample)
    fold_profile = profile_text(profiler, "tottime", 8)

    del decoded, sample
    gc.collect()
    note = "after dropping the envelopes (the specs stay, shared with the jobs)"
    rows.append(row("(a) state resident", "", "", f"{rss_mib() - base:,.0f} MiB above the start; {note}"))

    data, wall = timed("encode_state", encode_state, state)
    note = f"snapshot {len(data) / MIB:,.0f} MiB"
    rows.append(row("(b) encode_state", f"{wall:.2f}", f"{len(data) / MIB / wall:,.0f} MiB/s", note))
    copy, wall = timed("decode_state", decode_state, data)
    assert isinstance(copy, State) and len(copy.jobs) == len(state.jobs)
    rows.append(row("(b) decode_state", f"{wall:.2f}", f"{len(data) / MIB / wall:,.0f} MiB/s", ""))
    del state, copy, data
    gc.collect()
    print(f"\nfold profile (first {min(n, 100_000):,} entries, by own time):\n\n```\n{fold_profile}\n```\n")


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
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        await scheduler.rebuild(use_snapshot=mode == "snapshot")
        if profiler is not None:
            profiler.disable()
            out["profile"] = profile_text(profiler, "tottime", 12)
            out["profile_cum"] = profile_text(profiler, "cumulative", 12)
        out["wall"] = time.perf_counter() - started
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
    """Time the parts of a snapshot load: the object read (linear, via ``writeinto``) and the decode."""
    started = time.perf_counter()
    store = await bus.js.object_store(subjects.SNAPSHOT_BUCKET)
    buffer = io.BytesIO()
    await store.get(snapshot.NAME, writeinto=buffer)
    read = time.perf_counter() - started
    started = time.perf_counter()
    snap = snapshot.decode(buffer.getbuffer())
    decode = time.perf_counter() - started
    return {"read": read, "decode": decode, "bytes": buffer.tell(), "jobs": len(snap.state.jobs)}


def run_child(
    mode: str, url: str, password: str, n_nodes: int, profile: bool, timeout: float
) -> dict[str, Any]:
    """Run ``child`` in a fresh interpreter; its result, or {"error": ...}."""
    argv = [sys.executable, __file__, "--child", mode, "--url", url, "--nodes", str(n_nodes)]
    env = {**os.environ, PASSWORD_ENV: password}
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
    entries: list[Entry], n_nodes: int, rows: list[str], profile: bool, timeout: float
) -> dict[str, Any]:
    """(c) append to a real log, then restart from it and from a snapshot; the log rebuild's result."""
    password = secrets.token_hex(16)
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-rebuild-"))
    server = NatsServer(tmp / "nats", [roles.service_user(roles.ADMIN, password)])
    n = len(entries)
    from_log: dict[str, Any] = {}
    try:
        server.start()
        creds = Credentials(url=server.url, user=roles.ADMIN, password=password)
        print("  appending", file=sys.stderr, flush=True)
        wall = asyncio.run(append_log(creds, entries))
        rows.append(row("(c) append to the log", f"{wall:.2f}", f"{n / wall:,.0f} events/s", "publish_async"))
        store = sum(f.stat().st_size for f in (tmp / "nats").rglob("*") if f.is_file())
        for mode in ("log", "snapshot-parts", "snapshot"):
            print(f"  child {mode}", file=sys.stderr, flush=True)
            res = run_child(mode, server.url, password, n_nodes, profile and mode == "log", timeout)
            step = f"(c) rebuild from the {mode}"
            if "error" in res:
                rows.append(row(step, "stopped", "", res["error"].replace("\n", " ")[-300:], -1.0))
                break
            if mode == "snapshot-parts":
                note = (
                    f"read with writeinto=BytesIO {res['read']:.2f} s + Snapshot decode {res['decode']:.2f} s"
                    f" ({res['bytes'] / MIB:,.0f} MiB): a linear load, for comparison"
                )
                rows.append(row("(c) snapshot parts", f"{res['read'] + res['decode']:.2f}", "", note, -1.0))
                continue
            note = (
                f"fresh process: resident after {res['rss_mib']:,.0f} MiB ({res['jobs']:,} jobs,"
                f" last_seq {res['last_seq']:,}, snapshot seq {res['from_snapshot']:,})"
            )
            if mode == "log":
                from_log = res
                note += f"; JetStream store {store / MIB:,.0f} MiB"
            rate = f"{n / res['wall']:,.0f} events/s"
            rows.append(row(step, f"{res['wall']:.2f}", rate, note, res["peak_rss_mib"]))
            if mode == "log":
                size = res["snapshot_bytes"] / MIB
                rows.append(row("(c) snapshot.save", f"{res['save_wall']:.2f}", "", f"{size:,.0f} MiB", -1.0))
        return from_log
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    """Run the benchmark (or, with --child, one scheduler start) and print the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="100,000 events (1,000 nodes)")
    parser.add_argument("--profile", action="store_true", help="profile the rebuild from the log")
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

    n_events, n_nodes = (100_000, 1_000) if args.small else (1_000_000, 10_000)
    # Peak RSS: of this process so far; of the fresh scheduler process for a rebuild; -: not measured.
    rows = ["| step | wall s | rate | peak RSS MiB | notes |", "|---|---|---|---|---|"]
    print(f"## rebuild: {n_events:,} events ({n_nodes:,} nodes, {n_events - n_nodes:,} pending jobs)\n")
    print(f"Machine: {machine()}\n")
    entries, wall = timed("build", lambda: list(log_entries(n_events, n_nodes)))
    rows.append(row("build + encode the log", f"{wall:.2f}", f"{n_events / wall:,.0f} events/s", ""))
    fold_steps(entries, rows)
    from_log = server_steps(entries, n_nodes, rows, args.profile, args.child_timeout)
    print("\n".join(rows))
    print(
        "\nTargets at 1,000,000 events: rebuild from the log <= 10 s, from a snapshot <= 1 s;"
        " scheduler RSS with 1,000,000 pending jobs <= 2 GiB."
    )
    if "profile" in from_log:
        print(f"\ncProfile of the rebuild from the log, by own time:\n\n```\n{from_log['profile']}\n```")
        print(f"\nBy cumulative time:\n\n```\n{from_log['profile_cum']}\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
