"""The cluster's job id counter in JetStream KV (the ``JobIds`` port over NATS).

One compare-and-set of ``+count`` on a KV key allocates a block, so any gateway replica may allocate (a job
array's block is reserved at once). The bucket is looked up once per process: the lookup is a request of its
own (stream info), which every submit paid before. While the bucket's stream is between leaders (a NATS
server of the cluster was lost) an allocation tries again for up to ``RETRY_S``; a retry is safe, at worst an
id is skipped (an update that landed but whose answer was lost), as Slurm's ids can skip too.

The counter's value and revision after this process's own last update are kept: the next allocation sends its
compare-and-set at once, without reading the key first (one round trip instead of two). When another replica
moved the counter meanwhile, the update fails on the revision and the key is read again.

``id_blocks.GroupedIds`` sits in front (``Bus``): the demands of concurrent submissions that arrive while one
allocation is out share the next one.
"""

from __future__ import annotations

import asyncio
import time

import nats
from nats.js import JetStreamContext
from nats.js.errors import (
    APIError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue

from corral.libs.runtime.errors import TransientError
from corral.schemas import subjects

#: The errors of a JetStream that is there but cannot answer now (electing a leader, reconnecting). A
#: publish nobody answers is ``NoStreamResponseError`` in nats-py (it replaces ``NoRespondersError``).
UNAVAILABLE = (
    ServiceUnavailableError,
    nats.errors.NoRespondersError,
    NoStreamResponseError,
    nats.errors.ConnectionClosedError,
)
#: Seconds an allocation keeps trying while JetStream is unavailable, and the pause between two tries.
RETRY_S = 15.0
PAUSE_S = 0.5


class NatsJobIds:
    """Job ids from the ``corral_ids`` bucket."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self._kv: KeyValue | None = None
        self._known: tuple[int, int] | None = None  # (value, revision) of the key after our last update

    async def next_job_id(self, count: int = 1) -> int:
        """Allocate ``count`` consecutive job ids and return the first."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        deadline = time.monotonic() + RETRY_S
        while True:
            try:
                return await self._allocate(count)
            except (*UNAVAILABLE, nats.errors.TimeoutError) as exc:
                self._kv = None  # looked up again: its stream may have moved
                if time.monotonic() > deadline:
                    raise TransientError(f"job ids cannot be allocated now ({exc!r}); try again") from exc
                await asyncio.sleep(PAUSE_S)

    async def last_job_id(self) -> int:
        """The highest job id allocated so far (0 if none)."""
        try:
            current = await (await self._bucket()).get(subjects.JOB_ID_KEY)
        except KeyNotFoundError:
            return 0
        return int(current.value or b"0")

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(subjects.IDS_BUCKET)
        return self._kv

    async def _allocate(self, count: int) -> int:
        kv = await self._bucket()
        for _ in range(100):
            if self._known is None:
                try:
                    current = await kv.get(subjects.JOB_ID_KEY)
                except KeyNotFoundError:
                    try:
                        revision = await kv.create(subjects.JOB_ID_KEY, str(count).encode())
                        self._known = (count, revision)
                        return 1
                    except UNAVAILABLE:
                        raise
                    except (KeyWrongLastSequenceError, APIError):
                        continue
                self._known = (int(current.value or b"0"), int(current.revision or 0))
            last, revision = self._known
            self._known = None  # until this update is known to have landed
            try:
                revision = await kv.update(subjects.JOB_ID_KEY, str(last + count).encode(), last=revision)
            except UNAVAILABLE:
                raise
            except (KeyWrongLastSequenceError, APIError):
                await asyncio.sleep(0)
                continue
            self._known = (last + count, revision)
            return last + 1
        raise TransientError("could not allocate a job id: too much contention")
