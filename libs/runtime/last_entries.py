"""The newest entry of each of many subjects in one request: a batched direct get (``multi_last``, nats-server
2.11+), for the gateway's lookups of the jobs a request names (``Bus.last_entries``).

``scancel -u`` of 20,000 jobs looked each job's submission up with a direct get of its own: a request, a
reply and a nats-py message each, ~25% of the gateway's busy time. One request
``$JS.API.DIRECT.GET.<stream>`` with ``{"multi_last": [subjects], "batch": n}`` answers with the newest
message of each subject that has one (as a direct get does: the entry's headers and data, its subject and
sequence in ``Nats-Subject`` and ``Nats-Sequence``), then an empty message with status 204 ("EOB"); a status
404 says none of them has one. A subject without an entry is simply absent. Any other status (a request the
server refuses, the stream gone) is an ``APIError``; no end within ``TIMEOUT_S`` is nats-py's
``TimeoutError``, as a direct get's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import APIError

from corral.libs.runtime.ports import LogEntry, decode_entry

#: Subjects asked for in one request (the server answers at most 1,024 messages to one).
CHUNK = 1000
#: Seconds one request may take to end.
TIMEOUT_S = 10.0
#: The statuses that end an answer: all sent (EOB), or nothing to send.
_END, _NONE = "204", "404"


async def last_entries(nc: Client, stream: str, wanted: Sequence[str]) -> dict[str, LogEntry]:
    """The newest entry of each subject of ``wanted`` that has one (no wildcards), by subject."""
    out: dict[str, LogEntry] = {}
    for start in range(0, len(wanted), CHUNK):
        await _one(nc, stream, wanted[start : start + CHUNK], out)
    return out


async def _one(nc: Client, stream: str, wanted: Sequence[str], out: dict[str, LogEntry]) -> None:
    """One request for ``wanted``, its entries put in ``out``."""
    if not wanted:
        return
    ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def received(msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status")
        if status is None:
            subject = headers.get("Nats-Subject", "")
            out[subject] = decode_entry(int(headers.get("Nats-Sequence", 0)), subject, msg.data)
        elif not ended.done():
            if status in (_END, _NONE):
                ended.set_result(None)
            else:
                description = headers.get("Description", "")
                ended.set_exception(APIError(code=int(status), description=description))

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=received)
    try:
        request = json.dumps({"multi_last": list(wanted), "batch": len(wanted)}).encode()
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", request, reply=inbox)
        try:
            await asyncio.wait_for(ended, TIMEOUT_S)
        except TimeoutError:
            raise NatsTimeout from None
    finally:
        await sub.unsubscribe()
