"""The scheduler's lease, as its shell holds it: the leader bucket's ``lease`` key (``KvLease``).

The rules are ``libs/core/lease.py``'s; the reads and compare-and-set writes ``libs/runtime/kv_lease.py``'s.
This module only does what ``lease.next_step`` says, every ``lease.poll_s(ttl)``:

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
from collections.abc import Callable

import msgspec
from nats.js import JetStreamContext

from corral.libs.core import lease as rules
from corral.libs.runtime import telemetry
from corral.libs.runtime.kv_lease import TRANSIENT, KvLease
from corral.schemas import subjects


class Leadership(KvLease):
    """One scheduler process's side of the lease."""

    def __init__(self, js: JetStreamContext, name: str, ttl_s: float, floor: Callable[[], int]) -> None:
        super().__init__(js, subjects.LEASE_KEY, name, ttl_s)
        self.floor = floor  # the newest epoch the fold has seen (a takeover bumps past it)
        self.was_leading = False
        self.gained = asyncio.Event()  # set when this process becomes the leader
        self.log = telemetry.logger()

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
                except TRANSIENT as exc:
                    self.log.warning("leader bucket unavailable, will retry", error=repr(exc))
                self.notice()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), rules.poll_s(self.ttl_s))
        finally:
            await self.release()

    async def step(self) -> None:
        """Steps 1 and 2: read, then take or renew if the rule says so."""
        key = await self.read()
        step = rules.next_step(time.monotonic(), key, self.token, self.renewed_at, self.ttl_s, self.floor())
        if step.action != "wait":
            await self.write(step.epoch)

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
        member = rules.Member(name=self.name, token=self.token, beat_at=time.time(), ttl_s=self.ttl_s)
        await self.put(subjects.member_key(self.name), member)

    async def release(self) -> None:
        """Mark our lease released (a standby takes it at its next poll) and remove our presence."""
        await super().release()
        await self.delete(subjects.member_key(self.name))

    async def roster(self) -> list[tuple[str, str, bool]]:
        """``scontrol ping``'s lines (``lease.roster``) from the bucket as it is now."""
        values = await self.entries("member.")
        key = await self.read()
        members: list[rules.Member] = []
        for value in values:
            with contextlib.suppress(msgspec.DecodeError):
                members.append(msgspec.json.decode(value, type=rules.Member))
        return rules.roster(time.time(), key.lease, members)
