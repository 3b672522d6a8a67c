"""The pure liveness rule (``libs/core/liveness.py``), with numbers: node timeout 10 s."""

from __future__ import annotations

import pytest

from corral.libs.core.liveness import Verdict, verdict

pytestmark = pytest.mark.unit

# (up, sign, heartbeat, window, now) -> verdict; the timeout is 10 s.
CASES: list[tuple[str, bool, float | None, float | None, float | None, float, Verdict]] = [
    ("up, heard 5 s ago", True, 95.0, 95.0, 0.0, 100.0, None),
    ("up, silent exactly the timeout", True, 90.0, 90.0, 0.0, 100.0, None),
    ("up, silent 11 s", True, 89.0, 89.0, 0.0, 100.0, "down"),
    ("up, registered 5 s ago, never a heartbeat", True, 95.0, None, 0.0, 100.0, None),
    ("up, nothing heard since the window opened 11 s ago", True, None, None, 89.0, 100.0, "down"),
    ("disconnected: no verdict however long the silence", True, 10.0, 10.0, None, 100.0, None),
    ("reconnected 5 s ago after 60 s of silence: a fresh window", True, 35.0, 35.0, 95.0, 100.0, None),
    ("reconnected 11 s ago, silent since: down", True, 35.0, 35.0, 89.0, 100.0, "down"),
    ("down, a heartbeat 2 s ago", False, 98.0, 98.0, 0.0, 100.0, "up"),
    ("down, last heartbeat 12 s ago", False, 88.0, 88.0, 0.0, 100.0, None),
    ("down, never heard: a window that opens brings no node back", False, None, None, 95.0, 100.0, None),
    ("down, heard before the window opened", False, 94.0, 94.0, 95.0, 100.0, None),
    ("down, registration only (no heartbeat)", False, 99.0, None, 0.0, 100.0, None),
    ("down, a heartbeat but disconnected now", False, 99.0, 99.0, None, 100.0, None),
]


@pytest.mark.parametrize(
    ("up", "sign", "heartbeat", "window", "now", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_verdict(
    up: bool, sign: float | None, heartbeat: float | None, window: float | None, now: float, expected: Verdict
) -> None:
    assert verdict(up=up, sign=sign, heartbeat=heartbeat, window=window, now=now, timeout=10.0) == expected
