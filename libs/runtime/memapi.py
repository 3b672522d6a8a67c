"""``MemApi``: API verbs called in memory, the fake of ``bus.NatsApi`` for fast tests.

A verb is served by a handler given the caller's user and the request's bytes; a verb nobody serves is a
TimeoutError at once (the NATS server's "no responders"), as is a handler slower than the call's timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

#: A server of one verb: (calling user, request bytes) -> reply bytes.
Handler = Callable[[str, bytes], Awaitable[bytes]]


class MemApi:
    """The ``ApiClient`` of ``user``, over handlers registered with ``serve``."""

    def __init__(self, user: str) -> None:
        self.user = user  # who the calls come from
        self._servers: dict[str, Handler] = {}  # verb -> its handler

    def serve(self, verb: str, handler: Handler) -> None:
        """Answer ``verb`` with ``handler`` from now on."""
        self._servers[verb] = handler

    async def request(self, verb: str, data: bytes, timeout: float) -> bytes:
        """The handler's reply; TimeoutError if nobody serves ``verb`` or it takes longer than ``timeout``."""
        handler = self._servers.get(verb)
        if handler is None:
            raise TimeoutError(f"nobody serves {verb}")
        async with asyncio.timeout(timeout):
            return await handler(self.user, data)
