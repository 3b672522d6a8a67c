"""The ``Clock`` port's adapters: the system's clock, and a fake one that moves only when a test says so.

``FakeClock.advance(seconds)`` moves both its wall and monotonic time and wakes every sleeper whose deadline
has come; ``FakeClock.asleep(n)`` waits (in real time, bounded) until ``n`` tasks sleep on it, which is how
a test knows a service loop has done its step and waits for the next.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field


class SystemClock:
    """The real time."""

    def now(self) -> float:
        """Wall-clock time (``time.time``)."""
        return time.time()

    def monotonic(self) -> float:
        """``time.monotonic``."""
        return time.monotonic()

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep ``seconds``, or less if ``wake`` is set first."""
        if wake is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), seconds)


@dataclass(eq=False)
class _Sleeper:
    """One task sleeping on a FakeClock."""

    deadline: float  # monotonic time it wakes at
    woken: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class FakeClock:
    """Time that stands still until ``advance``: exact timeouts and deadlines, in no real time."""

    def __init__(self, now: float = 1_700_000_000.0, monotonic: float = 1_000.0) -> None:
        self._wall = now  # wall time at monotonic time ``monotonic``
        self._start = monotonic  # the monotonic time the clock started at
        self._elapsed = 0.0  # how far it has been advanced
        self._sleepers: list[_Sleeper] = []  # tasks sleeping on the clock
        self._changed = asyncio.Event()  # set whenever a task starts or stops sleeping

    def now(self) -> float:
        """Wall time: the start time plus what was advanced."""
        return self._wall + self._elapsed

    def monotonic(self) -> float:
        """Monotonic time: the start plus what was advanced."""
        return self._start + self._elapsed

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep until the clock is advanced ``seconds`` further, or until ``wake`` is set."""
        if seconds <= 0 or (wake is not None and wake.is_set()):
            await asyncio.sleep(0)
            return
        sleeper = _Sleeper(self.monotonic() + seconds)
        self._sleepers.append(sleeper)
        self._changed.set()
        waiter = None
        if wake is not None:
            waiter = asyncio.ensure_future(wake.wait())
            waiter.add_done_callback(lambda _: self._wake(sleeper))
        try:
            await sleeper.woken
        finally:
            if waiter is not None:
                waiter.cancel()
            self._remove(sleeper)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` and wake the sleepers whose deadline has come."""
        if seconds < 0:
            raise ValueError(f"time does not go back: {seconds}")
        self._elapsed += seconds
        for sleeper in [s for s in self._sleepers if s.deadline <= self.monotonic()]:
            self._wake(sleeper)

    async def asleep(self, count: int = 1, timeout: float = 5.0) -> None:
        """Return once at least ``count`` tasks sleep on the clock; TimeoutError after ``timeout`` real
        seconds (a loop that never sleeps again is a failure, not a hang)."""
        async with asyncio.timeout(timeout):
            while len(self._sleepers) < count:
                self._changed.clear()
                await self._changed.wait()

    @property
    def sleeping(self) -> int:
        """How many tasks sleep on the clock now."""
        return len(self._sleepers)

    def _wake(self, sleeper: _Sleeper) -> None:
        # Taken off the list at once, so that ``asleep`` counts only tasks that went back to sleep.
        self._remove(sleeper)
        if not sleeper.woken.done():
            sleeper.woken.set_result(None)

    def _remove(self, sleeper: _Sleeper) -> None:
        if sleeper in self._sleepers:
            self._sleepers.remove(sleeper)
            self._changed.set()
