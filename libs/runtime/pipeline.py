"""Appends as asynchronous JetStream publishes: many in flight on one connection, each awaited on its own.

``js.publish`` is a request per append: the caller's coroutine holds a timer, an inbox future and a response
subscription lookup for it. ``Pipeline.publish`` sends the message at once with a reply subject under the
connection's one acknowledgement subscription, and the caller waits for the acknowledgement of its own
message. The server stores the messages of one connection in the order they were sent, so appends from one
coroutine keep their order; concurrent ones (a gateway's submissions) are pipelined.

- At most ``APPEND_IN_FLIGHT`` publishes await their acknowledgement per pipeline; another waits for a slot.
- A publish whose slot and acknowledgement do not come within ``APPEND_TIMEOUT_S`` (the server is away, the
  connection is being re-established) is a ``TimeoutError``: the entry may or may not be stored, and a retry
  with the same message id is safe (the server's deduplication). nats-py buffers what is published while it
  reconnects and sends its subscriptions again, so an acknowledgement can still arrive after a reconnection.
- A refusal (a wrong expected last sequence, a stream that is not there) is the ``APIError`` nats-py's
  ``js.publish`` would raise. nats-py's own ``publish_async`` (2.16) is not used: its acknowledgement handler
  raises such an error inside its callback instead of giving it to the waiting future, which then waits for
  ever (seen as a timeout on every conditional append that lost).
"""

from __future__ import annotations

import asyncio
import itertools

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError

#: Appends a pipeline has in flight at most (published, acknowledgement not yet received); more wait.
APPEND_IN_FLIGHT = 1024
#: Seconds an append waits for a slot among those in flight, then for its acknowledgement.
APPEND_TIMEOUT_S = 10.0
#: An acknowledgement's JSON (``{"stream": ..., "seq": ...}`` or ``{"error": ...}``).
_reply = msgspec.json.Decoder(dict)
#: The status a reply carries when no stream listens on the subject.
_NO_RESPONDERS = "503"


class Pipeline:
    """Asynchronous JetStream publishes on one connection."""

    def __init__(self, nc: Client, in_flight: int = APPEND_IN_FLIGHT) -> None:
        self.nc = nc
        self._slots = asyncio.Semaphore(in_flight)  # publishes in flight
        self._waiting: dict[str, asyncio.Future[api.PubAck]] = {}  # reply token -> its acknowledgement
        self._tokens = itertools.count()  # reply tokens
        self._base: str | None = None  # the acknowledgements' subject prefix, once subscribed
        self._first = asyncio.Lock()  # held while the subscription is made

    async def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> api.PubAck:
        """Publish and wait for the acknowledgement: ``APIError`` if the stream refused it, ``TimeoutError``
        if none came in time, nats-py's unavailability errors (no stream, connection closed) as they are."""
        # One deadline for the slot and the acknowledgement (``asyncio.timeout``: a timer, no task).
        async with asyncio.timeout(APPEND_TIMEOUT_S):
            base = self._base or await self._subscribe()
            async with self._slots:
                token = str(next(self._tokens))
                future: asyncio.Future[api.PubAck] = asyncio.get_running_loop().create_future()
                self._waiting[token] = future
                try:
                    await self.nc.publish(subject, data, reply=f"{base}.{token}", headers=headers)
                    return await future
                finally:
                    self._waiting.pop(token, None)

    async def _subscribe(self) -> str:
        async with self._first:
            if self._base is None:
                base = self.nc.new_inbox()  # under the connection's own inbox prefix
                await self.nc.subscribe(f"{base}.*", cb=self._acknowledged)
                self._base = base
            return self._base

    async def _acknowledged(self, msg: Msg) -> None:
        """Resolve the future of the publish this acknowledgement answers."""
        future = self._waiting.pop(msg.subject.rsplit(".", 1)[-1], None)
        if future is None or future.done():
            return  # its publish gave up (timed out): nobody waits
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            future.set_exception(NoStreamResponseError())
            return
        try:
            reply = _reply.decode(msg.data)
            if "error" in reply:
                APIError.from_error(reply["error"])  # raises the error's class (unavailable, bad request ...)
            # Built from its fields (nats-py's ``PubAck.from_response`` walks the dataclass's fields for each
            # acknowledgement: 4.1 against 0.8 us, every append of every service).
            ack = api.PubAck(
                stream=reply["stream"],
                seq=reply["seq"],
                domain=reply.get("domain"),
                duplicate=reply.get("duplicate"),
            )
            future.set_result(ack)
        except APIError as exc:
            future.set_exception(exc)
        except (msgspec.DecodeError, ValueError, KeyError, TypeError) as exc:
            future.set_exception(APIError(description=f"unreadable acknowledgement: {exc!r}"))
