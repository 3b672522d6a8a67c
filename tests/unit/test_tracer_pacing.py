"""The tracer exports no sooner than its delay after the previous export (``OTEL_BSP_SCHEDULE_DELAY``),
but a full fetch goes at once (a busy log), and stopping cuts the wait short, so what it holds still goes
out."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from corral.libs.runtime.bus import Bus
from corral.services.tracer.app import TracerService

pytestmark = pytest.mark.unit


async def test_an_export_waits_out_the_delay_since_the_last_one() -> None:
    # The pacing touches neither the bus nor the exporter: it only waits.
    service = TracerService(cast(Bus, None), InMemorySpanExporter(), delay=0.3)
    started = time.monotonic()
    await service._paced()  # nothing exported yet: no wait
    assert time.monotonic() - started < 0.1
    service.exported_at = time.monotonic()
    await service._paced()
    assert time.monotonic() - service.exported_at >= 0.3
    service.exported_at = time.monotonic()
    await service._paced(full=True)  # a full fetch: the log is busy, waiting would fall behind
    assert time.monotonic() - service.exported_at < 0.25
    service.exported_at = time.monotonic()
    asyncio.get_running_loop().call_later(0.05, service.stop.set)
    await service._paced()
    assert time.monotonic() - service.exported_at < 0.25
