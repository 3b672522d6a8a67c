"""``NatsApi``: API verbs called over NATS request/reply, the real adapter of the ``ApiClient`` port
(``ports.py``; its fake is ``memapi.MemApi``)."""

from __future__ import annotations

import nats
from nats.aio.client import Client

from corral.schemas import subjects


class NatsApi:
    """API verbs called over NATS request/reply as ``user`` (the last token of the request subject)."""

    def __init__(self, nc: Client, user: str) -> None:
        self.nc = nc
        self.user = user

    async def request(self, verb: str, data: bytes, timeout: float) -> bytes:
        """The reply to ``data`` on ``verb``; TimeoutError if nobody answers in time (or serves it)."""
        try:
            msg = await self.nc.request(subjects.api_subject(verb, self.user), data, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise TimeoutError(f"nobody serves {verb}") from None
        return bytes(msg.data)
