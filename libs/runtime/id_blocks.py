"""Job ids for many concurrent submissions from one counter round trip: blocks sized by the demand.

A gateway serves many submissions at once. Each needs ``count`` consecutive ids (1, or an array's size),
and each compare-and-set of the cluster's counter (``job_ids.NatsJobIds``) is a round trip to JetStream.
``GroupedIds`` puts the demands that arrive while one round trip is out into the next: one compare-and-set
of ``+sum(counts)`` reserves a block for all of them, and ``split`` hands each its own consecutive part. So:

- under load the blocks grow with the queue: one round trip serves every submission that waited for it,
  and the counter is never the serial bottleneck;
- ids stay unique across replicas and restarts: every block is a compare-and-set of the one counter.

With ``ahead`` ids held (``hold_ahead``: the gateway's ``IDS_AHEAD``), each reservation takes that many more
than its demands, and the next demands are served from them with no round trip at all: a single
submission is then one round trip to JetStream (the append), not two. What holding costs:

- a gateway's ids increase in the order it hands them out (a demand larger than what is held, an array,
  skips the rest of it and reserves anew), but two gateways each hold a block: the ids they hand out
  interleave out of submission order, within ``ahead`` of each other. Nothing orders jobs by id alone
  (priority ties go to the earlier submit time, then the id);
- a gateway that stops or crashes skips what it held (at most ``ahead`` ids), as Slurm's ids can skip;
- without holding (``ahead`` 0, the default) every demand at low load is its own block: ids dense and in
  the order the gateways asked for them, across replicas, and a restart skips only the ids in flight.

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
    """The ``JobIds`` port over ``reserve(count) -> first id``, one reservation for all concurrent demands,
    and ``ahead`` ids held beyond them once ``hold_ahead`` is called."""

    def __init__(
        self,
        reserve: Callable[[int], Awaitable[int]],
        last: Callable[[], Awaitable[int]],
        limit: int = MAX_BLOCK,
    ) -> None:
        self._reserve = reserve  # one round trip: ``count`` consecutive ids from the counter, the first
        self._last = last  # the highest id reserved so far
        self._limit = limit  # ids one reservation takes at most
        self._ahead = 0  # ids each reservation takes beyond its demands, to serve the next ones
        self._held = (0, 0)  # the ids reserved and not handed out yet: range(*_held)
        self._waiting: list[tuple[int, asyncio.Future[int]]] = []  # demands not yet in a reservation
        self._running: asyncio.Task[None] | None = None  # the reservation loop, while there are demands
        self.reservations = 0  # round trips made (for tests and metrics)

    def hold_ahead(self, ahead: int) -> None:
        """Reserve ``ahead`` ids beyond the demands from now on (the module docstring says what it costs)."""
        if ahead < 0:
            raise ValueError(f"ahead must be at least 0, got {ahead}")
        self._ahead = ahead

    async def next_job_id(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive ids; the first. An error of the reservation is every waiter's."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        if not self._waiting and (first := self._from_held(count)) is not None:
            return first  # no round trip
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting.append((count, future))
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._serve())
        return await future

    async def last_job_id(self) -> int:
        """The highest id reserved so far (0 if none), held ones included."""
        return await self._last()

    def _from_held(self, count: int) -> int | None:
        """The first of ``count`` held ids, now handed out; None if fewer are held."""
        first, end = self._held
        if end - first < count:
            return None
        self._held = (first + count, end)
        return first

    async def _serve(self) -> None:
        """Reserve blocks while demands wait: each round takes the demands queued while the last was out,
        the oldest served from the held ids first."""
        while self._waiting:
            count, future = self._waiting[0]
            if future.done():  # its request gave up before anything was reserved for it
                self._waiting.pop(0)
                continue
            if (first := self._from_held(count)) is not None:
                self._waiting.pop(0)
                future.set_result(first)
                continue
            served = take([count for count, _ in self._waiting], self._limit)
            group, self._waiting = self._waiting[:served], self._waiting[served:]
            counts = [count for count, _ in group]
            # what is still held is fewer than the oldest demand: skipped, so that ids keep increasing
            self._held = (0, 0)
            try:
                first = await self._reserve(sum(counts) + self._ahead)
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
            end = first + sum(counts)
            self._held = (end, end + self._ahead)
            for (_, future), start in zip(group, split(first, counts), strict=True):
                if not future.done():  # its request gave up (cancelled): its ids are skipped
                    future.set_result(start)
