"""The scheduler's lease, as its shell holds it: reads and compare-and-set writes of the leader bucket.

The rules are ``libs/core/lease.py``'s; this module only does what ``lease.next_step`` says, every
``lease.poll_s(ttl)``:

1. read the lease key (its value and revision);
2. ``take``: write a lease of our own with the bumped epoch, as a compare-and-set on the revision read
   (create if there is no key); ``renew``: rewrite ours the same way; a failed compare-and-set means
   someone else holds it: we are a standby (and say so, once);
3. beat: write our presence (``member.<name>``) every ``ttl / 3``, for ``scontrol ping``.

``leading()`` is the lease rule's ``leading`` on this process's monotonic clock: the scheduler asks it
before each cycle and before each append, so a process that was paused past its lease decides nothing
once it runs again, even before its next read tells it that it lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable

import msgspec
import nats
from nats.js import JetStreamContext
from nats.js.errors import APIError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from corral.libs.core import lease as rules
from corral.libs.runtime import telemetry
from corral.schemas import subjects

#: What a read or write of the bucket may raise when NATS is away for a moment (retried at the next poll).
_TRANSIENT = (TimeoutError, nats.errors.Error, APIError)


class Leadership:
    """One scheduler process's side of the lease."""

    def __init__(self, js: JetStreamContext, name: str, ttl_s: float, floor: Callable[[], int]) -> None:
        self.js = js
        self.name = name  # this scheduler's name (scontrol ping shows it)
        self.ttl_s = ttl_s
        self.floor = floor  # the newest epoch the fold has seen (a takeover bumps past it)
        self.token = uuid.uuid4().hex  # this process's id in the lease
        self.key: rules.Seen | None = None  # the lease key as last read
        self.renewed_at: float | None = None  # monotonic time we sent our last successful lease write
        self.epoch = 0  # the epoch of our lease (stamped on our decisions)
        self.was_leading = False
        self.gained = asyncio.Event()  # set when this process becomes the leader
        self.log = telemetry.logger()
        self._kv: KeyValue | None = None

    def leading(self) -> bool:
        """True while this process holds the lease (by its own clock)."""
        return rules.leading(time.monotonic(), self.renewed_at, self.ttl_s)

    async def kv(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.js.key_value(subjects.LEADER_BUCKET)
        return self._kv

    async def run(self, stop: asyncio.Event) -> None:
        """Poll, take or renew, beat, until stopped; then release the lease if we hold it."""
        next_beat = 0.0
        try:
            while not stop.is_set():
                try:
                    await self.step()
                    if time.monotonic() >= next_beat:
                        await self.beat()
                        next_beat = time.monotonic() + self.ttl_s / 3
                except _TRANSIENT as exc:
                    self.log.warning("leader bucket unavailable, will retry", error=repr(exc))
                self.notice()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), rules.poll_s(self.ttl_s))
        finally:
            await self.release()

    async def read(self) -> rules.Seen:
        """Read the lease key (step 1)."""
        kv = await self.kv()
        now = time.monotonic()
        try:
            entry = await kv.get(subjects.LEASE_KEY)
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

    async def step(self) -> None:
        """Steps 1 and 2: read, then take or renew if the rule says so."""
        key = await self.read()
        step = rules.next_step(time.monotonic(), key, self.token, self.renewed_at, self.ttl_s, self.floor())
        if step.action == "wait":
            return
        record = rules.Lease(holder=self.name, token=self.token, epoch=step.epoch, ttl_s=self.ttl_s)
        sent = time.monotonic()
        try:
            revision = await self._write(key.revision, record)
        except KeyWrongLastSequenceError:
            self.renewed_at = None  # someone else wrote first: they hold it
            return
        self.renewed_at, self.epoch = sent, step.epoch
        self.key = rules.Seen(revision=revision, lease=record, since=time.monotonic())

    async def _write(self, revision: int, record: rules.Lease) -> int:
        kv = await self.kv()
        data = msgspec.json.encode(record)
        try:
            if revision == 0:
                return await kv.create(subjects.LEASE_KEY, data)
            return await kv.update(subjects.LEASE_KEY, data, last=revision)
        except KeyWrongLastSequenceError:
            raise
        except APIError as exc:
            # The server's "wrong last sequence" (10071) is the lost compare-and-set; nats-py does not
            # always map it to KeyWrongLastSequenceError (a subclass of APIError).
            if getattr(exc, "err_code", None) == 10071:
                raise KeyWrongLastSequenceError() from exc
            raise

    def notice(self) -> None:
        """Log a change of role, once, and wake whoever waits for the leadership."""
        now = self.leading()
        if now == self.was_leading:
            return
        self.was_leading = now
        if now:
            self.log.info("took the scheduler lease", epoch=self.epoch, name=self.name)
            self.gained.set()
        else:
            self.log.warning("lost the scheduler lease: standby", epoch=self.epoch, name=self.name)
            self.gained.clear()

    async def beat(self) -> None:
        """Step 3: our presence, for ``scontrol ping``."""
        kv = await self.kv()
        member = rules.Member(name=self.name, token=self.token, beat_at=time.time(), ttl_s=self.ttl_s)
        await kv.put(subjects.member_key(self.name), msgspec.json.encode(member))

    async def release(self) -> None:
        """Mark our lease released (a standby takes it at its next poll) and remove our presence."""
        with contextlib.suppress(*_TRANSIENT, KeyWrongLastSequenceError):
            kv = await self.kv()
            if self.leading() and self.key is not None:
                record = rules.Lease(
                    holder=self.name, token=self.token, epoch=self.epoch, ttl_s=self.ttl_s, released=True
                )
                await self._write(self.key.revision, record)
            self.renewed_at = None
            await kv.delete(subjects.member_key(self.name))

    async def roster(self) -> list[tuple[str, str, bool]]:
        """``scontrol ping``'s lines (``lease.roster``) from the bucket as it is now."""
        kv = await self.kv()
        key = await self.read()
        members: list[rules.Member] = []
        with contextlib.suppress(nats.js.errors.NoKeysError):
            for name in await kv.keys():
                if not name.startswith("member."):
                    continue
                with contextlib.suppress(KeyNotFoundError, msgspec.DecodeError):
                    entry = await kv.get(name)
                    members.append(msgspec.json.decode(entry.value or b"", type=rules.Member))
        return rules.roster(time.time(), key.lease, members)
