"""Snapshots of the scheduler's state, so a restart replays only the tail of the log.

A snapshot is the state (the sequence of the last entry it applied included) plus the event id of that
entry, in the JetStream object store ``corral_snapshots`` under a versioned name (``NAME``). On start, a
snapshot is used only if it decodes and the log still holds an entry with that sequence and event id (the
log was not reset or replaced); otherwise the whole log is replayed. A snapshot can only ever make a start
faster, never different: replaying the tail from it gives the state the full replay gives (tests check both).

Layout (format 7; 4 to 6 the same but for the job arrays' tasks): frames, each a 4-byte big-endian length and
a zlib-compressed (level 1) MessagePack document: first the ``Header`` (the state without its jobs), then the
jobs in segments of ``SEGMENT_JOBS``, each a list in the state's order; a job array's task that shares its
spec, user and trace context with the task before it (as the fold makes them) is stored without its spec and
trace context, and decoded sharing them again (``_stored``, ``_shared``: a million pending tasks decode in
~1.1 s and 741 MiB instead of ~3.2 s and 1,536 MiB). What a load costs, at a million pending jobs
(``bench/rebuild.py``):

- reading the object: its chunks are read through the bulk reader (a pull consumer filtered on the object's
  chunk subject, ``log_reader.BulkReader``), 4x faster than nats-py's object store read here;
- inflating: zlib releases the GIL, so a worker thread inflates the next segment while the loop decodes one;
- decoding: msgspec builds two structs of ~40 fields per pending job (the job and its spec; one for a job
  array's task that shares its array's spec), the floor.

Older formats are other names (``scheduler-state-v3``: one zlib-compressed MessagePack of the whole state):
a scheduler of this version never reads them, so an old snapshot is a full replay, once, and the first save
deletes them. A save that dies half-way leaves the previous snapshot whole: the object store writes the new
chunks first and switches the object's meta to them last.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import struct
import zlib
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import msgspec
from nats.js.errors import NotFoundError, ObjectNotFoundError

from corral.libs.core.state import NO_SPEC, Job, State
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import TransientError
from corral.libs.runtime.log_reader import BulkReader, BulkReadError
from corral.schemas import subjects

#: Bump when the layout or the State's shape changes incompatibly: old snapshots are then ignored.
#: 2: MessagePack (smaller, faster to decode than JSON); jobs keep slim specs and their ``submit_seq``.
#: 3: the MessagePack zlib-compressed.
#: 4: frames (the state without its jobs, then the jobs in segments), each zlib-compressed; specs are
#:    ``SlimJobSpec`` (no script or environment key).
#: 5: the state keeps what forgets ended jobs (``libs/core/retention.py``): a format-4 state has no queue of
#:    ended jobs, so they would never be forgotten.
#: 6: a job's queueing cause is ``Job.queued_by``, no longer in ``Job.causes`` (a format-5 job's allocation
#:    would name no cause).
#: 7: a job array's task that shares its spec, user and trace context with the task before it is stored
#:    without its spec and trace context (``_stored``), and decoded sharing them again (``_shared``).
FORMAT = 7
NAME = f"scheduler-state-v{FORMAT}"
#: The names of the formats before, deleted by the first save of this one.
OLD_NAMES = tuple(f"scheduler-state-v{n}" for n in range(2, FORMAT))
#: Jobs per segment.
SEGMENT_JOBS = 1 << 16

_LENGTH = struct.Struct(">I")
#: Runs a function that reads the state away from the loop, the fold held back (``Scheduler.aside``).
Aside = Callable[..., Awaitable[list[bytes]]]


class Header(msgspec.Struct, kw_only=True):
    """The first frame."""

    format: int  # FORMAT at the time of writing
    event_id: str  # event id of the entry at state.last_seq
    state: State  # the state after applying that entry, without its jobs
    segments: int  # frames of jobs that follow


class Snapshot(msgspec.Struct, kw_only=True):
    """What is stored, decoded."""

    format: int  # FORMAT at the time of writing
    event_id: str  # event id of the entry at state.last_seq
    state: State  # the state after applying that entry


_encoder = msgspec.msgpack.Encoder()
_header = msgspec.msgpack.Decoder(Header)
_jobs = msgspec.msgpack.Decoder(list[Job])


def encode(snap: Snapshot) -> list[bytes]:
    """The MessagePack documents of a snapshot (uncompressed): the header, then the job segments (each job as
    ``_stored`` stores it; a segment's copies are dropped once it is encoded)."""
    segments: list[bytes] = []
    segment: list[Job] = []
    tasks: dict[int, Job] = {}  # the task before, of each job array, by the array's id
    for job in snap.state.jobs.values():
        segment.append(_stored(job, tasks) if job.array_job_id else job)
        if len(segment) == SEGMENT_JOBS:
            segments.append(_encoder.encode(segment))
            segment = []
    if segment:
        segments.append(_encoder.encode(segment))
    header = Header(
        format=snap.format,
        event_id=snap.event_id,
        state=msgspec.structs.replace(snap.state, jobs={}),
        segments=len(segments),
    )
    return [_encoder.encode(header), *segments]


def compress(documents: list[bytes]) -> bytes:
    """The stored form of encoded documents: each compressed and framed."""
    out = io.BytesIO()
    for doc in documents:
        frame = zlib.compress(doc, 1)
        out.write(_LENGTH.pack(len(frame)))
        out.write(frame)
    return out.getvalue()


def _frames(data: bytes | memoryview) -> Iterator[memoryview]:
    view, pos = memoryview(data), 0
    while pos < len(view):
        if pos + _LENGTH.size > len(view):
            raise msgspec.DecodeError("a snapshot frame is cut short")
        (size,) = _LENGTH.unpack_from(view, pos)
        pos += _LENGTH.size
        if pos + size > len(view):
            raise msgspec.DecodeError("a snapshot frame is cut short")
        yield view[pos : pos + size]
        pos += size


def _inflate(frame: memoryview) -> bytes:
    try:
        return zlib.decompress(frame)
    except zlib.error as exc:
        raise msgspec.DecodeError(f"not a compressed snapshot frame ({exc})") from None


def decode(data: bytes | memoryview) -> Snapshot:
    """A stored snapshot's content (msgspec.DecodeError if it is not one). Each job segment is inflated in
    a worker thread while the one before it is decoded (a plain thread pool: an asyncio task would keep, and
    its repr format, megabytes of result)."""
    frames = list(_frames(data))
    if not frames:
        raise msgspec.DecodeError("an empty snapshot")
    header = _header.decode(_inflate(frames[0]))
    segments = frames[1:]
    if len(segments) != header.segments:
        raise msgspec.DecodeError(f"{len(segments)} job segments, the header says {header.segments}")
    jobs: dict[int, Job] = {}
    tasks: dict[int, Job] = {}  # the task decoded last of each job array, by the array's id
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-inflate") as pool:
        ahead = [pool.submit(_inflate, segment) for segment in segments[:1]]
        for k in range(len(segments)):
            raw = ahead.pop().result()
            if k + 1 < len(segments):
                ahead.append(pool.submit(_inflate, segments[k + 1]))
            for job in _jobs.decode(raw):
                jobs[job.job_id] = job
                if job.array_job_id:
                    _shared(job, tasks)
                elif job.spec is NO_SPEC:  # (only an array's task is stored without one)
                    raise msgspec.DecodeError(f"job {job.job_id} is stored without a spec")
    header.state.jobs = jobs
    return Snapshot(format=header.format, event_id=header.event_id, state=header.state)


def _stored(task: Job, tasks: dict[int, Job]) -> Job:
    """A job array's task as a snapshot stores it. The fold gives an array's tasks one spec, user and trace
    context (one submission); stored each in full, they were decoded each with copies of their own: ~880
    bytes a task more (a million pending tasks: 1,536 MiB resident instead of 741, and seconds of the
    kernel's zeroing of fresh pages). A task that shares all three with the task before it (an update gives
    a pending task a spec of its own) is stored without its spec and trace context: a copy without them."""
    before = tasks.get(task.array_job_id)
    tasks[task.array_job_id] = task
    if (
        before is not None
        and task.spec is before.spec
        and task.traceparent is before.traceparent
        and task.user == before.user
    ):
        return msgspec.structs.replace(task, spec=NO_SPEC, traceparent=None)
    return task


def _shared(task: Job, tasks: dict[int, Job]) -> None:
    """A task decoded: one stored without its spec (``_stored``; msgspec gives an omitted field the default
    itself) gets the task's before it, and its user and trace context (the decoded copy of its user is
    dropped)."""
    if task.spec is NO_SPEC:
        before = tasks.get(task.array_job_id)
        if before is None:
            raise msgspec.DecodeError(f"job {task.job_id} is stored without a spec and no task before it")
        task.spec, task.user, task.traceparent = before.spec, before.user, before.traceparent
    tasks[task.array_job_id] = task


async def save(bus: Bus, state: State, aside: Aside | None = None) -> int:
    """Write a snapshot of ``state``; returns its size in bytes. ``aside``: where to encode it, the fold held
    back meanwhile (``Scheduler.aside``: the planning thread; a million jobs take ~1 s, which on the loop
    would hold back the leader's lease renewals); None: here."""
    entry = await bus.entry(state.last_seq)
    if entry.envelope is None:
        raise TransientError(f"no decodable entry at {state.last_seq} to anchor a snapshot")
    snap = Snapshot(format=FORMAT, event_id=entry.envelope.meta.event_id, state=state)
    documents = encode(snap) if aside is None else await aside(encode, snap)
    # Compressing reads no state and releases the GIL: it runs beside the loop, the fold going on.
    data = await asyncio.to_thread(compress, documents)
    store = await bus.js.object_store(subjects.SNAPSHOT_BUCKET)
    await store.put(NAME, data)
    for old in OLD_NAMES:
        with contextlib.suppress(ObjectNotFoundError, NotFoundError):
            await store.delete(old)
    return len(data)


async def read(bus: Bus) -> bytes:
    """The stored snapshot's bytes (ObjectNotFoundError if there is none): its chunks through the bulk
    reader, or nats-py's object store read if the bulk read cannot be done."""
    store = await bus.js.object_store(subjects.SNAPSHOT_BUCKET)
    info = await store.get_info(NAME)
    if info.deleted or not info.nuid:
        raise ObjectNotFoundError
    chunks = f"$O.{subjects.SNAPSHOT_BUCKET}.C.{info.nuid}"
    reader = BulkReader(bus.nc, stream=f"OBJ_{subjects.SNAPSHOT_BUCKET}", batch=64, filter_subject=chunks)
    parts: list[bytes] = []
    try:
        async for batch in reader.read(1, 2**63):
            parts.extend(bytes(data) for _, _, data in batch)
    except BulkReadError:
        # Read it the ordinary way, into one buffer (nats-py would grow a bytes object chunk by chunk).
        buffer = io.BytesIO()
        await store.get(NAME, writeinto=buffer)
        return buffer.getvalue()
    data = b"".join(parts)
    if len(data) != (info.size or 0):
        raise msgspec.DecodeError(f"the snapshot has {len(data)} bytes, its meta says {info.size}")
    return data


async def load(bus: Bus) -> tuple[State | None, str]:
    """The latest usable snapshot's state, or None, and why (for the log)."""
    try:
        data = await read(bus)
    except (ObjectNotFoundError, NotFoundError):
        return None, "no snapshot"
    except msgspec.DecodeError as exc:
        return None, f"snapshot does not read whole ({exc}): full replay"
    try:
        snap = decode(data)
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
