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


class CountingCounter:
    """A counter whose reservations answer at once, counted."""

    def __init__(self, value: int = 0) -> None:
        self.value = value
        self.asked: list[int] = []  # the counts reserved, one per round trip

    async def reserve(self, count: int) -> int:
        self.asked.append(count)
        first = self.value + 1
        self.value += count
        return first

    async def last(self) -> int:
        return self.value


async def test_ids_held_ahead_serve_the_next_submissions_without_a_round_trip() -> None:
    counter = CountingCounter()
    ids = GroupedIds(counter.reserve, counter.last)
    ids.hold_ahead(3)
    assert [await ids.next_job_id() for _ in range(5)] == [1, 2, 3, 4, 5]
    assert counter.asked == [4, 4]  # one round trip for four single submissions
    assert await ids.last_job_id() == 8  # 6-8 held


async def test_a_demand_larger_than_the_held_ids_skips_them_so_that_ids_keep_increasing() -> None:
    counter = CountingCounter()
    ids = GroupedIds(counter.reserve, counter.last)
    ids.hold_ahead(3)
    assert await ids.next_job_id() == 1  # 2-4 held
    assert await ids.next_job_id(2) == 2  # from the held ones
    assert await ids.next_job_id(5) == 5  # 4 held, fewer than 5: skipped
    assert await ids.next_job_id() == 10
    assert counter.asked == [4, 8]


async def test_two_gateways_holding_ids_never_hand_out_the_same_one() -> None:
    counter = CountingCounter()
    first, second = GroupedIds(counter.reserve, counter.last), GroupedIds(counter.reserve, counter.last)
    for gateway in (first, second):
        gateway.hold_ahead(2)
    handed: dict[GroupedIds, list[int]] = {first: [], second: []}
    for _ in range(4):  # submissions alternate between the two
        for gateway in (first, second):
            handed[gateway].append(await gateway.next_job_id())
    # each gateway's ids increase; across gateways they interleave (1-3 and 4-6, then 7-9 and 10-12)
    assert handed[first] == [1, 2, 3, 7] and handed[second] == [4, 5, 6, 10]
    assert len(set(handed[first]) | set(handed[second])) == 8


async def test_without_holding_every_demand_is_its_own_round_trip() -> None:
    counter = CountingCounter()
    ids = GroupedIds(counter.reserve, counter.last)
    assert [await ids.next_job_id() for _ in range(3)] == [1, 2, 3]
    assert counter.asked == [1, 1, 1]


async def test_demands_waiting_for_a_round_trip_are_served_from_what_it_held_in_order() -> None:
    counter = HeldCounter()
    ids = GroupedIds(counter.reserve, counter.last)
    ids.hold_ahead(4)
    first = asyncio.create_task(ids.next_job_id())
    await until(lambda: counter.asked == [5])
    rest = [asyncio.create_task(ids.next_job_id(n)) for n in (2, 1, 3)]
    await asyncio.sleep(0)
    counter.gate.set()
    assert await first == 1
    assert await rest[0] == 2 and await rest[1] == 4  # from the 2-5 the first round held
    await until(lambda: len(counter.asked) == 2)
    assert counter.asked == [5, 7]  # the array of 3 did not fit what was left (5): a round of its own
    counter.gate.set()
    assert await rest[2] == 6
