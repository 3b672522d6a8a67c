"""A service's loops: the first that fails ends the others and fails the service; stop ends them all."""

from __future__ import annotations

import asyncio

import pytest

from corral.libs.runtime.service import run_until_stopped

pytestmark = pytest.mark.unit


async def forever(ended: list[str], name: str) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        ended.append(name)


async def fails_soon() -> None:
    await asyncio.sleep(0.01)
    raise KeyError("follow lost its consumer")


async def test_a_failing_loop_stops_the_others_and_raises() -> None:
    stop, ended = asyncio.Event(), []
    with pytest.raises(KeyError, match="follow lost its consumer"):
        await run_until_stopped(stop, forever(ended, "a"), fails_soon(), forever(ended, "b"))
    assert stop.is_set() and sorted(ended) == ["a", "b"]


async def test_stop_ends_every_loop_without_error() -> None:
    stop, ended = asyncio.Event(), []
    asyncio.get_running_loop().call_later(0.01, stop.set)
    await run_until_stopped(stop, forever(ended, "a"), forever(ended, "b"))
    assert sorted(ended) == ["a", "b"]


async def test_loops_that_return_on_their_own_end_the_wait() -> None:
    stop = asyncio.Event()

    async def quick() -> None:
        await asyncio.sleep(0)

    await asyncio.wait_for(run_until_stopped(stop, quick(), quick()), timeout=5)
    assert stop.is_set()
