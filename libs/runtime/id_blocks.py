"""Job ids for many concurrent submissions from one counter round trip: blocks sized by the demand.

A gateway serves many submissions at once. Each needs ``count`` consecutive ids (1, or an array's size),
and each compare-and-set of the cluster's counter (``job_ids.NatsJobIds``) is a round trip to JetStream.
``GroupedIds`` puts the demands that arrive while one round trip is out into the next: one compare-and-set
of ``+sum(counts)`` reserves a block for all of them, and ``split`` hands each its own consecutive part. So:

- at low load every demand is its own block (ids stay dense and in the order the gateways asked for them,
  across replicas, as before);
- under load the blocks grow with the queue: one round trip serves every submission that waited for it,
  and the counter is never the serial bottleneck;
- a gateway holds no ids in reserve: a restart or a crash loses only the ids of the requests in flight
  (skipped, as Slurm's ids can skip), never a block of spares;
- ids stay unique across replicas and restarts: every block is a compare-and-set of the one counter.

A retried submission still gets its first id: the gateway reads it from the original entry (the log's
message id deduplication), and the id the retry reserved is skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from itertools import accumulate

#: Ids a single compare-and-set reserves at most (the demands beyond wait for the next round trip).
MAX_BLOCK = 100_000


def split(first: int, counts: Sequence[int]) -> list[int]:
    """The first id of each demand when a block starting at ``first`` is shared out in order: demand k gets
    ``counts[k]`` consecutive ids right after those of the demands before it."""
    return [first + before for before in accumulate([0, *counts[:-1]])] if counts else []


def take(counts: Sequence[int], limit: int = MAX_BLOCK) -> int:
    """How many of the waiting demands (oldest first) one block serves: as many as fit in ``limit`` ids,
    and always at least the first (an array larger than the limit is a block of its own)."""
    total = 0
    for k, count in enumerate(counts):
        total += count
        if total > limit and k > 0:
            return k
    return len(counts)


class GroupedIds:
    """The ``JobIds`` port over ``reserve(count) -> first id``, one reservation for all concurrent demands."""

    def __init__(
        self,
        reserve: Callable[[int], Awaitable[int]],
        last: Callable[[], Awaitable[int]],
        limit: int = MAX_BLOCK,
    ) -> None:
        self._reserve = reserve  # one round trip: ``count`` consecutive ids from the counter, the first
        self._last = last  # the highest id reserved so far
        self._limit = limit  # ids one reservation takes at most
        self._waiting: list[tuple[int, asyncio.Future[int]]] = []  # demands not yet in a reservation
        self._running: asyncio.Task[None] | None = None  # the reservation loop, while there are demands
        self.reservations = 0  # round trips made (for tests and metrics)

    async def next_job_id(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive ids; the first. An error of the reservation is every waiter's."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((count, future))
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._serve())
        return await future

    async def last_job_id(self) -> int:
        """The highest id reserved so far (0 if none)."""
        return await self._last()

    async def _serve(self) -> None:
        """Reserve blocks while demands wait: each round takes the demands queued while the last was out."""
        while self._waiting:
            served = take([count for count, _ in self._waiting], self._limit)
            group, self._waiting = self._waiting[:served], self._waiting[served:]
            counts = [count for count, _ in group]
            try:
                first = await self._reserve(sum(counts))
            except asyncio.CancelledError:  # the service is stopping: nobody gets an id of this round
                for _, future in group + self._waiting:
                    future.cancel()
                raise
            except Exception as exc:  # every demand of this round fails alike; the next round tries again
                for _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.reservations += 1
            for (_, future), start in zip(group, split(first, counts), strict=True):
                if not future.done():  # its request gave up (cancelled): its ids are skipped
                    future.set_result(start)
