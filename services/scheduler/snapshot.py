"""Snapshots of the scheduler's state, so a restart replays only the tail of the log.

A snapshot is the state (MessagePack, zlib-compressed at level 1: about 6x smaller to store and read; the
state carries the sequence of the last entry it applied) plus the event id of that entry, in the JetStream
object store ``corral_snapshots`` under a versioned name. On start, a snapshot is used only if it decodes
and the log still holds an entry with that sequence and event id (the log was not reset or replaced);
otherwise the whole log is replayed. A snapshot can only ever make a start faster, never different:
replaying the tail from it gives the state the full replay gives (tests check both).
"""

from __future__ import annotations

import asyncio
import io
import zlib

import msgspec
from nats.js.errors import NotFoundError, ObjectNotFoundError

from corral.libs.core.state import State
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import TransientError
from corral.schemas import subjects

#: Bump when the State's shape changes incompatibly: old snapshots are then ignored.
#: 2: MessagePack (smaller, faster to decode than JSON); jobs keep slim specs and their ``submit_seq``.
#: 3: the MessagePack zlib-compressed.
FORMAT = 3
NAME = f"scheduler-state-v{FORMAT}"


class Snapshot(msgspec.Struct, kw_only=True):
    """What is stored."""

    format: int  # FORMAT at the time of writing
    event_id: str  # event id of the entry at state.last_seq
    state: State  # the state after applying that entry


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Snapshot)


def decode(data: bytes | memoryview) -> Snapshot:
    """A stored snapshot's content (msgspec.DecodeError if it is not one)."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise msgspec.DecodeError(f"not a compressed snapshot ({exc})") from None
    return _decoder.decode(raw)


def compress(data: bytes) -> bytes:
    """The stored form of an encoded snapshot."""
    return zlib.compress(data, 1)


async def save(bus: Bus, state: State) -> int:
    """Write a snapshot of ``state``; returns its size in bytes."""
    entry = await bus.entry(state.last_seq)
    if entry.envelope is None:
        raise TransientError(f"no decodable entry at {state.last_seq} to anchor a snapshot")
    # Encoding holds the GIL (so it sees one state); compressing does not, so it runs beside the loop.
    raw = _encoder.encode(Snapshot(format=FORMAT, event_id=entry.envelope.meta.event_id, state=state))
    data = await asyncio.to_thread(compress, raw)
    store = await bus.js.object_store(subjects.SNAPSHOT_BUCKET)
    await store.put(NAME, data)
    return len(data)


async def load(bus: Bus) -> tuple[State | None, str]:
    """The latest usable snapshot's state, or None, and why (for the log)."""
    try:
        store = await bus.js.object_store(subjects.SNAPSHOT_BUCKET)
        # Read into one buffer: nats-py would otherwise grow a bytes object chunk by chunk (quadratic).
        buffer = io.BytesIO()
        await store.get(NAME, writeinto=buffer)
    except (ObjectNotFoundError, NotFoundError):
        return None, "no snapshot"
    try:
        snap = decode(buffer.getbuffer())
    except msgspec.DecodeError as exc:
        return None, f"snapshot does not decode ({exc}): full replay"
    if snap.format != FORMAT:
        return None, f"snapshot format {snap.format} is not {FORMAT}: full replay"
    if snap.state.last_seq == 0:
        return None, "empty snapshot"
    try:
        entry = await bus.entry(snap.state.last_seq)
    except NotFoundError:
        return None, f"the log has no entry {snap.state.last_seq} any more: full replay"
    if entry.envelope is None or entry.envelope.meta.event_id != snap.event_id:
        return None, "the snapshot belongs to another log: full replay"
    return snap.state, f"snapshot at {snap.state.last_seq}"
