"""The steps of ``rebuild.py`` that run in its own process, each measured on its own (this checkout's code).

(a) decoding: every entry in full (``decode_envelope``: the old path's decoder, every other consumer's) and
    slim (``decode_slim_envelope``: the scheduler's); the fold of the slim envelopes; all with the cyclic GC
    paused, as the scheduler's rebuild runs;
(b) the snapshot of the folded state: encode + compress and decode;
(c) reading the log from a real nats-server without folding: ``Bus.read`` (nats-py's ordered consumer, full
    decode included: the old path's reader), the bulk reader alone, and the bulk reader with the slim
    decode; each with the server's CPU seconds.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_clusters import cpu_seconds  # bench/ is this script's directory: on sys.path

from corral.libs.core.fold import fold
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.log_reader import BulkReader
from corral.libs.runtime.streams import connect
from corral.schemas import events as ev
from corral.schemas.codec import decode_envelope, decode_slim_envelope
from corral.services.scheduler import snapshot

MIB = 2**20

#: One log entry ready to append: (subject, Nats-Msg-Id, JSON bytes).
Entry = tuple[str, str, bytes]
#: A table row: step, wall seconds, rate, peak RSS MiB (negative: not measured), notes.
Row = tuple[str, float, str, float, str]


def rss_mib(field: str = "VmRSS") -> float:
    """Current resident set size (MiB); ``VmHWM``: its peak since this program was exec'd."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def load() -> str:
    """The 1-minute load average, for the notes."""
    return f"load {os.getloadavg()[0]:.1f}"


def paused(label: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """(fn(*args), wall seconds) with the cyclic GC off; progress to stderr."""
    gc.collect()
    gc.disable()
    started = time.perf_counter()
    try:
        out = fn(*args)
    finally:
        wall = time.perf_counter() - started
        gc.enable()
    print(f"  {label}: {wall:.2f} s, rss {rss_mib():,.0f} MiB, {load()}", file=sys.stderr, flush=True)
    return out, wall


def fold_steps(entries: list[Entry]) -> list[Row]:
    """(a) and (b)."""
    n = len(entries)
    nbytes = sum(len(e[2]) for e in entries)
    rows: list[Row] = []
    full, wall = paused("decode", lambda: [decode_envelope(e[2]) for e in entries])
    note = f"{n:,} entries, {nbytes / MIB:,.0f} MiB of JSON ({nbytes / n:,.0f} B each); {load()}"
    rows.append(("(a) decode_envelope (full)", wall, f"{n / wall:,.0f}/s", -1, note))
    del full
    slim, wall = paused(
        "slim decode", lambda: [(s, decode_slim_envelope(e[2])) for s, e in enumerate(entries, 1)]
    )
    rows.append(
        ("(a) decode_slim_envelope", wall, f"{n / wall:,.0f}/s", -1, f"no script, no environment; {load()}")
    )
    before = rss_mib()
    state, wall = paused("fold", fold, slim)
    note = f"{len(state.jobs):,} jobs, {len(state.nodes):,} nodes; +{rss_mib() - before:,.0f} MiB; {load()}"
    rows.append(("(a) fold of the slim envelopes", wall, f"{n / wall:,.0f}/s", -1, note))
    del slim
    documents, wall = paused(
        "snapshot encode", snapshot.encode, snapshot.Snapshot(format=4, event_id="x", state=state)
    )
    data, packed = paused("snapshot compress", snapshot.compress, documents)
    raw = sum(map(len, documents)) / MIB
    note = f"{len(documents) - 1} job segments, {raw:,.0f} MiB -> {len(data) / MIB:,.0f} MiB"
    rows.append(("(b) snapshot encode + compress", wall + packed, "", -1, f"{note}; {load()}"))
    copy, wall = paused("snapshot decode", snapshot.decode, data)
    assert len(copy.state.jobs) == len(state.jobs)
    us = wall / max(len(state.jobs), 1) * 1e6
    rows.append(("(b) snapshot decode", wall, f"{us:.2f} us/job", -1, f"inflate one segment ahead; {load()}"))
    return rows


async def read_steps(creds: Credentials, n: int, pid: int) -> list[Row]:
    """(c): the log read three ways, each wall, this process's CPU and the server's."""
    nc = await connect(creds, name="bench-read")
    rows: list[Row] = []
    try:

        async def old() -> int:
            return sum([1 async for _ in Bus(nc, actor="bench").read(1)])

        async def bulk(decode: Callable[[Any], ev.Envelope] | None) -> int:
            count = 0
            async for batch in BulkReader(nc).read(1, n):
                if decode is not None:
                    for _, _, data in batch:
                        decode(data)
                count += len(batch)
            return count

        steps = [
            ("(c) read: Bus.read, full decode (old path)", old),
            ("(c) read: bulk reader alone", lambda: bulk(None)),
            ("(c) read: bulk reader + slim decode", lambda: bulk(decode_slim_envelope)),
        ]
        for label, step in steps:
            gc.collect()
            gc.disable()
            cpu, server, started = time.process_time(), cpu_seconds(pid), time.perf_counter()
            try:
                count = await step()
            finally:
                gc.enable()
            wall = time.perf_counter() - started
            mine, theirs = time.process_time() - cpu, cpu_seconds(pid) - server
            note = f"CPU: this process {mine:.2f} s, nats-server {theirs:.2f} s"
            print(f"  {label}: {wall:.2f} s, {note}, {load()}", file=sys.stderr, flush=True)
            assert count == n, f"{label} read {count} entries, not {n}"
            rows.append((label, wall, f"{n / wall:,.0f}/s", -1, f"{note}; {load()}"))
    finally:
        await nc.close()
    return rows
