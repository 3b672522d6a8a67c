"""One lease key of the leader bucket, held by this process: reads and compare-and-set writes.

The rules are ``libs/core/lease.py``'s (who may take, renew or wait); this class only does the IO they
need, for any lease of the bucket ``subjects.LEADER_BUCKET``: the scheduler's leadership
(``services/scheduler/leadership.py``) and each accounting partition (``services/accounting/holding.py``).

- ``read``: the key's value and revision (a missing key still has a revision: its delete marker's);
- ``write``: a lease of our own with the epoch asked for, as a compare-and-set on the revision read (create
  if there is no key); a lost compare-and-set means someone else holds it;
- ``release``: mark our lease released, so that a waiting process takes it at its next poll;
- ``put``/``entries``: the presence keys beside the leases.

``leading()`` is the lease rule's ``leading`` on this process's monotonic clock: a process paused past its
lease counts itself out as soon as it runs again, before its next read tells it that it lost.

Each read or write gives up after ``lease.op_timeout_s`` (a third of the lease), a ``TimeoutError`` like any
other transient failure: a request lost with a NATS server is sent again at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import msgspec
import nats
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from corral.libs.core import lease as rules
from corral.schemas import subjects

#: What a read or write of the bucket may raise when NATS is away for a moment (retried at the next poll).
TRANSIENT = (TimeoutError, nats.errors.Error, APIError)


class KvLease:
    """This process's side of one lease key."""

    def __init__(
        self, js: JetStreamContext, key: str, name: str, ttl_s: float, token: str | None = None
    ) -> None:
        self.js = js
        self.lease_key = key  # the key in the leader bucket
        self.name = name  # this process's name (written as the holder)
        self.ttl_s = ttl_s
        self.token = token or uuid.uuid4().hex  # this process's id in the lease
        self.key: rules.Seen | None = None  # the lease key as last read
        self.renewed_at: float | None = None  # monotonic time we sent our last successful lease write
        self.epoch = 0  # the epoch of our lease
        self.op_timeout_s = rules.op_timeout_s(ttl_s)  # a read or write is given up after this
        self._kv: KeyValue | None = None

    def leading(self) -> bool:
        """True while this process holds the lease (by its own clock)."""
        return rules.leading(time.monotonic(), self.renewed_at, self.ttl_s)

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(subjects.LEADER_BUCKET)
        return self._kv

    async def read(self) -> rules.Seen:
        """Read the lease key: its revision and value, and since when we see that revision."""
        now = time.monotonic()
        try:
            async with asyncio.timeout(self.op_timeout_s):
                entry = await (await self.kv()).get(self.lease_key)
        except KeyNotFoundError as exc:
            # A deleted key still has a revision (its delete marker's): the takeover's CAS is on it.
            revision = getattr(getattr(exc, "entry", None), "revision", None) or 0
            self.key = rules.seen(self.key, revision, None, now)
            return self.key
        try:
            value: rules.Lease | None = msgspec.json.decode(entry.value or b"", type=rules.Lease)
        except msgspec.DecodeError:
            value = None  # a value that does not decode is replaced at the next takeover
        self.key = rules.seen(self.key, entry.revision or 0, value, now)
        return self.key

    async def write(self, epoch: int) -> bool:
        """Take or renew: write our lease with ``epoch`` on the revision last read; False if someone else
        wrote first (they hold it)."""
        assert self.key is not None, "read the key first"
        record = rules.Lease(holder=self.name, token=self.token, epoch=epoch, ttl_s=self.ttl_s)
        sent = time.monotonic()
        try:
            revision = await self._cas(self.key.revision, record)
        except KeyWrongLastSequenceError:
            self.renewed_at = None
            return False
        self.renewed_at, self.epoch = sent, epoch
        self.key = rules.Seen(revision=revision, lease=record, since=time.monotonic())
        return True

    async def release(self) -> None:
        """Mark our lease released, if we hold it (a failed write is left to lapse)."""
        with contextlib.suppress(*TRANSIENT, KeyWrongLastSequenceError):
            if self.leading() and self.key is not None:
                record = rules.Lease(
                    holder=self.name, token=self.token, epoch=self.epoch, ttl_s=self.ttl_s, released=True
                )
                await self._cas(self.key.revision, record)
        self.renewed_at = None

    async def put(self, key: str, value: msgspec.Struct) -> None:
        """Write a presence key beside the lease (plain put: only its writer writes it)."""
        async with asyncio.timeout(self.op_timeout_s):
            await (await self.kv()).put(key, msgspec.json.encode(value))

    async def delete(self, key: str) -> None:
        """Remove a presence key (a clean stop)."""
        with contextlib.suppress(*TRANSIENT):
            async with asyncio.timeout(self.op_timeout_s):
                await (await self.kv()).delete(key)

    async def entries(self, prefix: str) -> list[bytes]:
        """The values of the keys under ``prefix`` (presences; it ends with ``.``), as they are now.

        One ephemeral pull consumer of the bucket's stream (the last entry of each key under the prefix, in
        memory, no acks), deleted at the end. Not nats-py's ``KeyValue.keys``: it left a consumer behind on
        every call, for the server to drop minutes later, and an accounting holder asks four times a second;
        past a few hundred the server refused them, and the holder lost its partition's lease for ~40 s every
        5 minutes (sacct stood still meanwhile)."""
        stream = f"KV_{subjects.LEADER_BUCKET}"
        config = api.ConsumerConfig(
            filter_subject=f"$KV.{subjects.LEADER_BUCKET}.{prefix}>",
            deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=api.AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=5.0,  # (deleted at the end; this only bounds one a dead process left)
        )
        values: list[bytes] = []
        async with asyncio.timeout(self.op_timeout_s):
            info = await self.js.add_consumer(stream, config)
            try:
                psub = await self.js.pull_subscribe_bind(consumer=info.name, stream=stream)
                remaining = int(info.num_pending or 0)
                while remaining > 0:
                    for msg in await psub.fetch(min(remaining, 256), timeout=self.op_timeout_s):
                        remaining -= 1
                        if (msg.headers or {}).get("KV-Operation") not in ("DEL", "PURGE"):
                            values.append(msg.data or b"")
                await psub.unsubscribe()
            finally:
                with contextlib.suppress(*TRANSIENT):
                    await self.js.delete_consumer(stream, info.name)
        return values

    async def _cas(self, revision: int, record: rules.Lease) -> int:
        data = msgspec.json.encode(record)
        try:
            async with asyncio.timeout(self.op_timeout_s):
                kv = await self.kv()
                if revision == 0:
                    return await kv.create(self.lease_key, data)
                return await kv.update(self.lease_key, data, last=revision)
        except KeyWrongLastSequenceError:
            raise
        except APIError as exc:
            # The server's "wrong last sequence" (10071) is the lost compare-and-set; nats-py does not
            # always map it to KeyWrongLastSequenceError (a subclass of APIError).
            if getattr(exc, "err_code", None) == 10071:
                raise KeyWrongLastSequenceError() from exc
            raise
