"""The entries of a few subjects of the log, up to its newest when asked: a history's read (``corral audit``,
``Bus.entries``).

One ephemeral pull consumer filtered on every subject at once, so the server skips the rest of the log; no
acks, in memory, deleted at the end (or by the server once idle). It is read in bulk
(``log_reader.BulkReader``: no nats-py message per entry): a user's history over a log of 100,000 jobs took
13 s through nats-py's fetch. Where the bulk reader cannot go on (a connection over TLS, a lost connection),
the rest is read through nats-py (``_fetched``), each entry once. An entry whose subject the caller does not
want is skipped undecoded; ``slim`` decodes submissions without their script and environment.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from corral.libs.runtime import telemetry
from corral.libs.runtime.errors import TransientError
from corral.libs.runtime.job_ids import UNAVAILABLE
from corral.libs.runtime.log_reader import BulkReader, BulkReadError
from corral.libs.runtime.ports import LogEntry, decode_entry
from corral.schemas import subjects
from corral.schemas.codec import decode_envelope, decode_slim_envelope
from corral.schemas.events import Envelope

#: Entries one fetch of the nats-py path asks for.
FETCH = 512


async def filtered(
    nc: Client,
    js: JetStreamContext,
    subject_filters: Sequence[str],
    wanted: Callable[[str], bool] | None = None,
    slim: bool = False,
) -> AsyncIterator[LogEntry]:
    """Entries on any of ``subject_filters`` in log order, up to the newest there when it started (the
    module docstring)."""
    if not subject_filters:
        return
    decode = decode_slim_envelope if slim else decode_envelope
    try:
        last = int((await js.stream_info(subjects.EVENTS_STREAM)).state.last_seq)
    except (APIError, TimeoutError, *UNAVAILABLE) as exc:
        raise TransientError(f"reading the log's last sequence failed: {exc!r}") from exc
    done = 0  # the sequence of the last entry looked at
    try:
        async for batch in BulkReader(nc, filter_subjects=subject_filters).read(1, last):
            for seq, subject, data in batch:
                done = seq
                if wanted is None or wanted(subject):
                    yield decode_entry(seq, subject, bytes(data), decode=decode)
        return
    except BulkReadError as exc:
        telemetry.logger().info("bulk read unavailable; reading through nats-py", reason=str(exc))
    async for entry in _fetched(js, subject_filters, done + 1, last, wanted, decode):
        yield entry


async def _fetched(
    js: JetStreamContext,
    subject_filters: Sequence[str],
    from_seq: int,
    to_seq: int,
    wanted: Callable[[str], bool] | None,
    decode: Callable[[bytes], Envelope],
) -> AsyncIterator[LogEntry]:
    """``filtered``'s entries from ``from_seq`` to ``to_seq`` through one nats-py pull consumer."""
    name = f"history-{uuid.uuid4().hex}"
    config = api.ConsumerConfig(
        name=name,
        filter_subjects=list(subject_filters),
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=from_seq,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=60.0,
        mem_storage=True,
        num_replicas=1,
    )
    try:
        info = await js.add_consumer(subjects.EVENTS_STREAM, config)
        psub = await js.pull_subscribe_bind(consumer=name, stream=subjects.EVENTS_STREAM)
    except (APIError, TimeoutError, *UNAVAILABLE) as exc:
        raise TransientError(f"reading {', '.join(subject_filters)} failed: {exc!r}") from exc
    try:
        remaining = int(info.num_pending or 0)
        while remaining > 0:
            try:
                msgs = await psub.fetch(min(remaining, FETCH), timeout=5.0)
            except TimeoutError as exc:
                raise TransientError(f"reading {', '.join(subject_filters)} timed out") from exc
            for msg in msgs:
                meta = msg.metadata
                remaining = min(remaining - 1, meta.num_pending)
                seq = meta.sequence.stream
                if seq > to_seq:
                    return
                if wanted is None or wanted(msg.subject):
                    yield decode_entry(seq, msg.subject, msg.data, decode=decode)
    finally:
        with contextlib.suppress(Exception):
            await psub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(subjects.EVENTS_STREAM, name)
