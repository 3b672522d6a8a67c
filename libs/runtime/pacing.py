"""How often a consumer that need not follow the log at once fetches (``Bus.consume``'s ``pause``): the
tracer and the accounting let the entries gather and wake once for them."""

from __future__ import annotations

import math
import time


class Gathered:
    """``Bus.consume``'s ``pause`` for a consumer that need not follow the log at once (the tracer, the
    accounting): no fetch sooner than ``delay`` seconds after the last one, so that the entries gather in the
    consumer and it wakes once for them, not at each entry while the other services serve it; none after a
    fetch of ``batch`` entries (a busy log: waiting would fall behind)."""

    def __init__(self, delay: float, batch: int) -> None:
        self.delay = delay
        self.batch = batch
        self.fetched_at = -math.inf  # time.monotonic() of the last fetch

    def __call__(self, fetched: int) -> float:
        """Seconds before the next fetch, the last one having brought ``fetched`` entries."""
        now = time.monotonic()
        wait = pause_s(self.fetched_at, self.delay, now, full=fetched >= self.batch)
        self.fetched_at = now + wait
        return wait


def pause_s(fetched_at: float, delay: float, now: float, *, full: bool) -> float:
    """How long a ``Gathered`` consumer waits before a fetch: until ``delay`` after the last one
    (``fetched_at``, monotonic seconds), and not at all after a ``full`` fetch."""
    if full:
        return 0.0
    return max(0.0, fetched_at + delay - now)
