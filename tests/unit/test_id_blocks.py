"""Job ids for concurrent submissions (``libs/runtime/id_blocks.py``): blocks sized by the demand.

``split`` and ``take`` are pure; ``GroupedIds`` runs over a counter whose reservation is a round trip the
test holds open, so that the demands arriving meanwhile can be seen to share the next one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from corral.libs.runtime.id_blocks import GroupedIds, split, take

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


@pytest.mark.parametrize(
    ("first", "counts", "starts"),
    [
        (1, [], []),
        (1, [1], [1]),
        (10, [1, 1, 1], [10, 11, 12]),
        (5, [3, 1, 100, 2], [5, 8, 9, 109]),
    ],
    ids=["none", "one", "singles", "arrays-and-singles"],
)
def test_a_block_is_shared_out_in_order(first: int, counts: list[int], starts: list[int]) -> None:
    assert split(first, counts) == starts


@pytest.mark.parametrize(
    ("counts", "limit", "served"),
    [
        ([1, 1, 1], 10, 3),
        ([4, 4, 4], 10, 2),
        ([50, 1], 10, 1),
        ([1, 50], 10, 1),
        ([10], 10, 1),
    ],
    ids=["all-fit", "up-to-the-limit", "a-large-array-alone", "a-large-array-waits", "exactly"],
)
def test_a_block_takes_the_oldest_demands_that_fit(counts: list[int], limit: int, served: int) -> None:
    assert take(counts, limit) == served


class HeldCounter:
    """A counter whose every reservation waits until the test lets it through."""

    def __init__(self) -> None:
        self.value = 0
        self.asked: list[int] = []  # the counts reserved, one per round trip
        self.gate = asyncio.Event()

    async def reserve(self, count: int) -> int:
        self.asked.append(count)
        await self.gate.wait()
        self.gate.clear()
        first = self.value + 1
        self.value += count
        return first

    async def last(self) -> int:
        return self.value


async def until(condition: Callable[[], bool]) -> None:
    """Let the loop run until ``condition`` holds."""
    while not condition():
        await asyncio.sleep(0)


async def test_demands_arriving_during_a_round_trip_share_the_next_one() -> None:
    counter = HeldCounter()
    ids = GroupedIds(counter.reserve, counter.last)
    first = asyncio.create_task(ids.next_job_id())
    await until(lambda: counter.asked == [1])
    # While the first reservation is out, an array of 5 and three single jobs arrive.
    rest = [asyncio.create_task(ids.next_job_id(n)) for n in (5, 1, 1, 1)]
    await asyncio.sleep(0)
    counter.gate.set()
    assert await first == 1
    await until(lambda: len(counter.asked) == 2)
    counter.gate.set()
    assert [await t for t in rest] == [2, 7, 8, 9]
    assert counter.asked == [1, 8] and ids.reservations == 2
    assert await ids.last_job_id() == 9


async def test_a_failed_reservation_fails_its_demands_and_the_next_round_goes_on() -> None:
    calls = 0

    async def reserve(count: int) -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        if calls == 1:
            raise ConnectionError("JetStream away")
        return 100

    async def last() -> int:
        return 0

    ids = GroupedIds(reserve, last)
    failed = asyncio.create_task(ids.next_job_id())
    with pytest.raises(ConnectionError):
        await failed
    assert await ids.next_job_id(3) == 100


async def test_a_demand_given_up_leaves_its_ids_unused_and_the_others_unharmed() -> None:
    counter = HeldCounter()
    ids = GroupedIds(counter.reserve, counter.last)
    kept = asyncio.create_task(ids.next_job_id())
    dropped = asyncio.create_task(ids.next_job_id())
    await until(lambda: counter.asked == [2])
    dropped.cancel()
    counter.gate.set()
    assert await kept == 1
    later = asyncio.create_task(ids.next_job_id())
    await until(lambda: len(counter.asked) == 2)
    counter.gate.set()
    assert await later == 3  # id 2 was the dropped demand's: skipped, never given to another
