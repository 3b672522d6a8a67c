"""A NATS connection's events (``libs/runtime/nats_link.py``): one structured line each, watchers told."""

from __future__ import annotations

import pytest
import structlog

from corral.libs.runtime.nats_link import Link

pytestmark = pytest.mark.unit


async def test_each_event_is_one_line_and_the_watchers_hear_of_drops_and_returns() -> None:
    link = Link("corral-health")
    link.url = lambda: "nats://127.0.0.1:4222"
    told: list[bool] = []
    link.watch(told.append)
    with structlog.testing.capture_logs() as lines:
        await link.error(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 4222)"))
        await link.disconnected()
        await link.reconnected()
        await link.closed()
    assert [(line["event"], line["log_level"]) for line in lines] == [
        ("nats error", "warning"),
        ("nats disconnected", "warning"),
        ("nats reconnected", "info"),
        ("nats connection closed", "info"),
    ]
    assert lines[0]["error_type"] == "ConnectionRefusedError"
    assert "Connect call failed" in lines[0]["error"]
    assert "exc_info" not in lines[0]
    assert lines[2]["url"] == "nats://127.0.0.1:4222"
    assert all(line["connection"] == "corral-health" for line in lines)
    assert told == [False, True]
