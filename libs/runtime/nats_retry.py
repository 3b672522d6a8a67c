"""When a command's request to the cluster is tried again, and how often: a NATS server that restarts, or
the services that reconnect after it, are a few seconds of refused connections and "no responders".

Only two errors are retried, because each means the request reached no service, whatever its verb:

- ``ServerUnreachable``: the TCP connection was refused or reset before anything was sent;
- ``NoResponders``: the server had nobody subscribed to the subject (a service not reconnected yet),
  so it delivered the request to no one.

So every verb is safe to retry on them, cancel and requeue as much as sbatch (whose submit token would
also make a duplicate harmless). A request that timed out, or whose connection was lost after it was
sent, is not retried: it may have been carried out.

The pauses between attempts follow ``delays``: 0.1 s, doubling up to 1 s, until they add up to ``budget``
seconds (``RETRY_S`` by default; the attempts' own time comes on top); the last error is raised then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from corral.libs.runtime.nats_errors import NoResponders, ServerUnreachable

T = TypeVar("T")

#: Seconds a command keeps trying a refused connection or a subject nobody answers.
RETRY_S = 10.0
#: The first pause between attempts, doubled after each, up to ``MAX_DELAY_S``.
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 1.0


def retryable(exc: BaseException) -> bool:
    """Whether a request that failed with ``exc`` reached no service, so that trying again is safe."""
    return isinstance(exc, ServerUnreachable | NoResponders)


def delays(budget: float) -> Iterator[float]:
    """The pauses before each retry: each attempt starts at the sum of the pauses before it, and none
    starts after ``budget`` seconds (the last pause is shortened to end there)."""
    spent, delay = 0.0, FIRST_DELAY_S
    while spent < budget:
        pause = min(delay, budget - spent)
        yield pause
        spent += pause
        delay = min(delay * 2, MAX_DELAY_S)


def retrying(
    attempt: Callable[[], T],
    budget: float = RETRY_S,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``attempt()``, tried again after each ``retryable`` error along ``delays(budget)``; the last
    error is raised once the budget is spent, any other error at once."""
    pauses = delays(budget)
    while True:
        try:
            return attempt()
        except Exception as exc:
            pause = next(pauses, None) if retryable(exc) else None
            if pause is None:
                raise
            sleep(pause)
