"""Which partitions of the projection this accounting process runs: the partition leases, held by its shell.

The rules are ``libs/core/partition_claims.py``'s, the lease IO ``libs/runtime/kv_lease.py``'s. Every
``lease.poll_s(ttl)``:

1. read the accounting presences (``accounting.replica.<i>``): which replicas are alive;
2. for each partition: read its lease and do what ``partition_claims.claim`` says: take or renew it (a
   compare-and-set write), or hand it back (``release``: its projection is stopped first, so the process
   that prefers it takes it over from a finished batch), or wait;
3. run the projection of each partition held (by this process's clock, ``KvLease.leading``) and stop
   that of each partition no longer held;
4. beat our presence every ``ttl / 3``.

On a clean stop every projection stops, then every lease held is released and the presence removed, so
the survivors take over at their next poll instead of a TTL later.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import msgspec
from nats.js import JetStreamContext

from corral.libs.core import lease as rules
from corral.libs.core import partition_claims as claims
from corral.libs.runtime import telemetry
from corral.libs.runtime.kv_lease import TRANSIENT, KvLease
from corral.services.accounting.partition import Partition


class PartitionHolder:
    """This process's side of the partition leases, and the projections of the partitions it holds."""

    def __init__(
        self,
        js: JetStreamContext,
        partitions: list[Partition],
        *,
        replica: int,
        name: str,
        ttl_s: float,
    ) -> None:
        self.partitions = partitions  # every partition of the projection, by k
        self.replica = replica  # ``--replica``: we prefer partition ``replica % P``
        self.name = name
        self.ttl_s = ttl_s
        count = len(partitions)
        self.token = uuid.uuid4().hex  # this process's id in every lease it holds and in its presence
        self.leases = [
            KvLease(js, claims.partition_key(p.k, count), name, ttl_s, self.token) for p in partitions
        ]
        self.running: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}  # projections by k
        self.log = telemetry.logger(replica=replica)

    def held(self) -> list[int]:
        """The partitions whose projection runs here now."""
        return sorted(self.running)

    async def run(self, stop: asyncio.Event) -> None:
        """Steps 1-4 until ``stop`` is set; then stop the projections and hand every partition back."""
        next_beat = 0.0
        try:
            while not stop.is_set():
                try:
                    if time.monotonic() >= next_beat:
                        await self.beat()
                        next_beat = time.monotonic() + self.ttl_s / 3
                    await self.step()
                except TRANSIENT as exc:
                    self.log.warning("leader bucket unavailable, will retry", error=repr(exc))
                await self.follow()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), rules.poll_s(self.ttl_s))
        finally:
            for k in list(self.running):
                await self._stop(k)
            for held in self.leases:
                await held.release()
            await self.leases[0].delete(claims.presence_key(self.replica))

    async def step(self) -> None:
        """Steps 1 and 2."""
        live = claims.alive(time.time(), await self.presences())
        for k, held in enumerate(self.leases):
            key = await held.read()
            claim = claims.claim(
                time.monotonic(),
                key,
                self.token,
                held.renewed_at,
                self.ttl_s,
                partition=k,
                partitions=len(self.leases),
                replica=self.replica,
                live=live,
            )
            if claim.action in ("take", "renew"):
                await held.write(claim.epoch)
            elif claim.action == "release":
                self.log.info("handing a partition back", partition=self.partitions[k].name)
                await self._stop(k)
                await held.release()

    async def follow(self) -> None:
        """Step 3: a projection runs exactly for each partition held (a finished one is started again)."""
        for k, held in enumerate(self.leases):
            task = self.running.get(k)
            if task is not None and task[0].done():
                await self._stop(k)  # it failed: its error is logged, and it starts again if still held
            if held.leading() and k not in self.running:
                self.log.info("projecting a partition", partition=self.partitions[k].name)
                done = asyncio.Event()
                self.running[k] = (asyncio.create_task(self.partitions[k].run(done)), done)
            elif not held.leading() and k in self.running:
                self.log.warning("lost a partition's lease", partition=self.partitions[k].name)
                await self._stop(k)

    async def beat(self) -> None:
        """Step 4: our presence."""
        presence = claims.Presence(
            replica=self.replica, name=self.name, token=self.token, beat_at=time.time(), ttl_s=self.ttl_s
        )
        await self.leases[0].put(claims.presence_key(self.replica), presence)

    async def presences(self) -> list[claims.Presence]:
        """Every accounting process's presence as the bucket holds it now."""
        found: list[claims.Presence] = []
        for value in await self.leases[0].entries(claims.PRESENCE_PREFIX):
            with contextlib.suppress(msgspec.DecodeError):
                found.append(msgspec.json.decode(value, type=claims.Presence))
        return found

    async def _stop(self, k: int) -> None:
        """Stop partition ``k``'s projection after its batch in hand; log how it ended if it failed."""
        task, done = self.running.pop(k)
        done.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=30)
        except asyncio.CancelledError:
            task.cancel()
            raise
        except Exception as exc:
            # TimeoutError: a transaction hung on an unreachable database; anything else is the
            # projection's failure. Either way it must not take the lease loop down.
            task.cancel()
            self.log.error("partition projection ended", partition=self.partitions[k].name, exc_info=exc)
