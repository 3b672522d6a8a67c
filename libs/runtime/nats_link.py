"""What a process's nats-py connection reports about itself: one structured log line per event, and the
loops that care told when the connection drops and when it is back.

nats-py's default error callback logs the raw traceback of every failed reconnection attempt, many lines
each, into the JSON logs. ``Link``'s callbacks replace it (``streams.connect`` installs them):

- ``error``: ``nats error`` (warning) with the error's type and text, e.g. a refused reconnection;
- ``disconnected``: ``nats disconnected`` (warning); the watchers are told ``False``;
- ``reconnected``: ``nats reconnected`` (info) with the server's URL, once nats-py has sent every
  subscription again; the watchers are told ``True``;
- ``closed``: ``nats connection closed`` (info); ``gone`` is set. nats-py gives up on a connection for good
  when the server refuses it (an ``-ERR`` such as the authorization violation of a password that
  ``corral credentials rotate`` retired): a service then exits, and its supervisor starts it again with the
  credentials file as it is now (``service.py``).

A watcher is a plain function of one boolean (connected or not), called in the event loop.

``flush(nc, timeout)`` is the round trip (PING/PONG) to use instead of ``nc.flush``, for two nats-py (2.x)
bugs:

- a flush that times out leaves its cancelled future in the client's queue of PONG waiters, and the late
  PONG (a server paused with SIGSTOP, then resumed) raises ``InvalidStateError`` in the read loop, which dies:
  the connection then receives nothing until its pings time out minutes later, and every later ``flush``
  returns at once without a round trip;
- ``nc.flush`` writes its PING straight to the socket while the commands before it (a SUB, a PUB) wait in
  the client's buffer for its flusher task, which writes them after the PING: the PONG can come before the
  server has them. A subscriber "flushed" could miss the next message published to it (1 in ~40 fresh
  connections here; ``test_step_io_roles`` failed so in CI), a service "ready once its verbs are subscribed"
  could answer no one. ``flush`` has the buffered commands written first (the flusher, waited for).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import nats.errors
from nats.aio.client import Client

from corral.libs.runtime import telemetry


class Link:
    """The callbacks of one NATS connection, and who to tell of its drops and returns."""

    def __init__(self, name: str) -> None:
        self.name = name  # the connection's name (``corral-<service>``), on each line
        self.watchers: list[Callable[[bool], None]] = []  # told False on a drop, True on a return
        self.url: Callable[[], str | None] = lambda: None  # the server now connected, set by connect
        self.log = telemetry.logger(connection=name)
        self.gone = asyncio.Event()  # set when nats-py has closed the connection for good

    def watch(self, watcher: Callable[[bool], None]) -> None:
        """Call ``watcher(False)`` whenever the connection drops and ``watcher(True)`` when it is back."""
        self.watchers.append(watcher)

    async def error(self, exc: Exception) -> None:
        """nats-py's ``error_cb``: one line, no traceback."""
        self.log.warning("nats error", error_type=type(exc).__name__, error=str(exc) or type(exc).__name__)

    async def disconnected(self) -> None:
        """nats-py's ``disconnected_cb``."""
        self.log.warning("nats disconnected")
        self._tell(False)

    async def reconnected(self) -> None:
        """nats-py's ``reconnected_cb``."""
        self.log.info("nats reconnected", url=self.url())
        self._tell(True)

    async def closed(self) -> None:
        """nats-py's ``closed_cb``."""
        self.log.info("nats connection closed")
        self.gone.set()

    def _tell(self, connected: bool) -> None:
        for watcher in self.watchers:
            watcher(connected)


async def flush(nc: Client, timeout: int) -> bool:
    """A PING/PONG round trip with the server within ``timeout`` seconds, after everything sent before it:
    True if it was answered.

    On a timeout the PONG waiter nats-py cancelled is replaced by a fresh one, so that the late PONG it was
    waiting for is matched to it harmlessly (PONGs answer PINGs in order), not to a later round trip and
    not to the cancelled future (which would end the read loop)."""
    try:
        await nc._flush_pending(force_flush=True)  # the commands before this round trip go out before it
        await nc.flush(timeout=timeout)
    except nats.errors.FlushTimeoutError:
        waiters = nc._pongs  # nats-py's private queue of PONG waiters: the bug above
        for i, waiter in enumerate(waiters):
            if waiter.cancelled():
                waiters[i] = asyncio.get_running_loop().create_future()
        return False
    except Exception:  # closed, reconnecting, draining: no round trip
        return False
    return True
