"""What a process's nats-py connection reports about itself: one structured log line per event, and the
loops that care told when the connection drops and when it is back.

nats-py's default error callback logs the raw traceback of every failed reconnection attempt, many lines
each, into the JSON logs. ``Link``'s callbacks replace it (``streams.connect`` installs them):

- ``error``: ``nats error`` (warning) with the error's type and text, e.g. a refused reconnection;
- ``disconnected``: ``nats disconnected`` (warning); the watchers are told ``False``;
- ``reconnected``: ``nats reconnected`` (info) with the server's URL, once nats-py has sent every
  subscription again; the watchers are told ``True``;
- ``closed``: ``nats connection closed`` (info).

A watcher is a plain function of one boolean (connected or not), called in the event loop.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.libs.runtime import telemetry


class Link:
    """The callbacks of one NATS connection, and who to tell of its drops and returns."""

    def __init__(self, name: str) -> None:
        self.name = name  # the connection's name (``corral-<service>``), on each line
        self.watchers: list[Callable[[bool], None]] = []  # told False on a drop, True on a return
        self.url: Callable[[], str | None] = lambda: None  # the server now connected, set by connect
        self.log = telemetry.logger(connection=name)

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

    def _tell(self, connected: bool) -> None:
        for watcher in self.watchers:
            watcher(connected)
