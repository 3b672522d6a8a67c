"""The tracer fetches no sooner than its delay after the previous fetch (``OTEL_BSP_SCHEDULE_DELAY``), so
that the log's entries gather and it wakes once for them instead of at each entry the other services are
serving; after a full fetch it does not wait (a busy log). The wait is computed by a pure function
(``pause_s``), so no test here measures time; that ``stop`` ends the bus's wait is checked with a bound."""

from __future__ import annotations

import asyncio
import math
from typing import cast

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral.libs.runtime.bus import Bus
from corral.libs.runtime.pacing import pause_s
from corral.services.tracer.app import BATCH, TracerService

pytestmark = pytest.mark.unit


def test_a_fetch_waits_out_the_delay_since_the_last_one() -> None:
    assert pause_s(-math.inf, 5.0, 100.0, full=False) == 0.0  # nothing fetched yet
    assert pause_s(100.0, 5.0, 101.0, full=False) == 4.0
    assert pause_s(100.0, 5.0, 106.0, full=False) == 0.0  # the delay is over
    assert pause_s(100.0, 5.0, 101.0, full=True) == 0.0  # a busy log: waiting falls behind


def test_the_service_paces_its_fetches_from_the_last_one() -> None:
    service = TracerService(cast(Bus, None), InMemorySpanExporter(), delay=5.0)
    assert service._pause(0) == 0.0  # the first fetch at once
    assert 4.9 < service._pause(1) <= 5.0  # then a delay after it
    assert service._pause(BATCH) == 0.0  # a full fetch: at once


class _Stuck:
    """A pull subscription whose fetch would hang: reaching it means the pause did not end on stop."""

    async def fetch(self, batch: int, timeout: float) -> list[object]:
        raise AssertionError("fetched although stop was set during the pause")

    async def unsubscribe(self) -> None:
        pass


class _Js:
    async def pull_subscribe(self, *args: object, **kwargs: object) -> _Stuck:
        return _Stuck()


async def test_stopping_ends_the_pause_before_a_fetch() -> None:
    bus = Bus.__new__(Bus)
    bus.js = cast(object, _Js())  # type: ignore[assignment]
    bus.metrics = None
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)

    async def handler(msgs: list[object]) -> None:
        raise AssertionError("nothing to handle")

    consume = bus.consume("s", "d", "x.>", handler, service="t", stop=stop, pause=lambda fetched: 600.0)
    await asyncio.wait_for(consume, 30)  # a TimeoutError here: the stop did not end the wait
