"""The CLI's synchronous NATS client logs in and sends a one-off request in one write (``nats_request``).

A command's call is a connection for one request: its CONNECT, SUB and PING go in the same write as the
request, a round trip less than waiting for the login's PONG first. A real nats-server takes a connection's
operations in order, so a refused login still delivers nothing. A pass-through TCP relay between the client
and the server records what the client writes.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from corral.libs.infra import NatsServer, NatsUser
from corral.libs.runtime.nats_request import Connection, NatsConnectError, request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

INBOX = "_INBOX_alice"
USERS = [
    NatsUser("alice", "alice-secret", publish=["svc.*.alice"], subscribe=[f"{INBOX}.>"]),
    NatsUser("svc", "svc-secret", publish=[], subscribe=["svc.>"], allow_responses=True),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with NatsServer(Path(tmp_path_factory.mktemp("nats")), USERS) as running:
        yield running


@pytest.fixture
async def delivered(server: NatsServer) -> AsyncIterator[list[bytes]]:
    """The requests delivered on ``svc.echo.*``, each answered with its own payload."""
    seen: list[bytes] = []
    nc = await nats.connect(server.url, user="svc", password="svc-secret", allow_reconnect=False)

    async def echo(msg: Msg) -> None:
        seen.append(msg.data)
        await msg.respond(msg.data)

    await nc.subscribe("svc.echo.*", cb=echo)
    await nc.flush()
    yield seen
    await nc.close()


class Relay:
    """Passes one connection through to ``upstream``, keeping each chunk the client wrote as it came."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.written: list[bytes] = []  # what the client sent, one recv at a time
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"nats://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with self.listener:
            client, _ = self.listener.accept()
        server = socket.create_connection(self.upstream)
        threading.Thread(target=self._pump, args=(server, client, None), daemon=True).start()
        self._pump(client, server, self.written)

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, record: list[bytes] | None) -> None:
        with source, target:
            while chunk := source.recv(1 << 16):
                if record is not None:
                    record.append(chunk)
                target.sendall(chunk)


def _upstream(server: NatsServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("nats://").rsplit(":", 1)
    return host, int(port)


async def test_a_one_off_request_goes_in_the_write_that_logs_in(
    server: NatsServer, delivered: list[bytes]
) -> None:
    relay = Relay(_upstream(server))
    reply = await asyncio.to_thread(
        request,
        relay.url,
        "svc.echo.alice",
        b"one",
        user="alice",
        password="alice-secret",
        inbox_prefix=INBOX,
    )
    assert reply.data == b"one" and delivered == [b"one"]
    first = relay.written[0]
    assert first.startswith(b"CONNECT ") and b"\r\nPUB svc.echo.alice " in first


async def test_a_connection_for_several_requests_logs_in_first(
    server: NatsServer, delivered: list[bytes]
) -> None:
    relay = Relay(_upstream(server))

    def two() -> list[bytes]:
        with Connection(relay.url, user="alice", password="alice-secret", inbox_prefix=INBOX) as conn:
            return [conn.request("svc.echo.alice", data).data for data in (b"a", b"b")]

    assert await asyncio.to_thread(two) == [b"a", b"b"]
    assert relay.written[0].startswith(b"CONNECT ") and b"PUB" not in relay.written[0]


async def test_a_refused_login_delivers_nothing(server: NatsServer, delivered: list[bytes]) -> None:
    with pytest.raises(NatsConnectError, match="Authorization Violation"):
        await asyncio.to_thread(
            request,
            server.url,
            "svc.echo.alice",
            b"refused",
            user="alice",
            password="wrong",
            inbox_prefix=INBOX,
        )
    # a request after it, on the server's own order, arrives: the refused one would have come first
    await asyncio.to_thread(
        request,
        server.url,
        "svc.echo.alice",
        b"after",
        user="alice",
        password="alice-secret",
        inbox_prefix=INBOX,
    )
    assert delivered == [b"after"]
