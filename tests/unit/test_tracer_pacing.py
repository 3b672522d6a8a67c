"""The tracer exports no sooner than its delay after the previous export (``OTEL_BSP_SCHEDULE_DELAY``),
but a full fetch goes at once (a busy log), and stopping cuts the wait short, so what it holds still goes
out. The wait is computed by a pure function (``pause_s``), so no test here measures time."""

from __future__ import annotations

import asyncio
import math
import time
from typing import cast

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral.libs.runtime.bus import Bus
from corral.services.tracer.app import TracerService, pause_s

pytestmark = pytest.mark.unit


def test_an_export_waits_out_the_delay_since_the_last_one() -> None:
    assert pause_s(-math.inf, 5.0, 100.0, full=False, stopping=False) == 0.0  # nothing exported yet
    assert pause_s(100.0, 5.0, 101.0, full=False, stopping=False) == 4.0
    assert pause_s(100.0, 5.0, 106.0, full=False, stopping=False) == 0.0  # the delay is over
    assert pause_s(100.0, 5.0, 101.0, full=True, stopping=False) == 0.0  # a busy log: waiting falls behind
    assert pause_s(100.0, 5.0, 101.0, full=False, stopping=True) == 0.0  # stopping: export what it holds


async def test_stopping_cuts_a_wait_short() -> None:
    # The pacing touches neither the bus nor the exporter: it only waits.
    service = TracerService(cast(Bus, None), InMemorySpanExporter(), delay=600.0)
    service.exported_at = time.monotonic()
    asyncio.get_running_loop().call_later(0.05, service.stop.set)
    await asyncio.wait_for(service._paced(), 30)  # a TimeoutError here: the stop did not end the wait
