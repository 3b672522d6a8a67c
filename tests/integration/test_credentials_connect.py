"""``corral credentials`` connects on a real nats-server as a short command should: a server that is not
there yet (or resets the handshake) is tried again within the budget, refused credentials are an error at
once, and a password the servers are about to load is tried until the budget is spent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.aio.client
import pytest

from corral.cli.credentials_cmd import connected, on_connection
from corral.libs.infra import roles
from corral.libs.infra.nats_server import NatsServer
from corral.libs.runtime.credentials import Credentials

pytestmark = pytest.mark.integration


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(tmp_path / "nats", [roles.service_user(roles.ADMIN, "right")]) as nats_server:
        yield nats_server


async def test_refused_credentials_fail_at_once(server: NatsServer) -> None:
    started = time.monotonic()
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await connected(Credentials(url=server.url, user=roles.ADMIN, password="wrong"), budget_s=120)
    assert time.monotonic() - started < 60  # not tried again for the budget


async def test_a_password_about_to_be_loaded_is_tried_for_the_budget(server: NatsServer) -> None:
    started = time.monotonic()
    creds = Credentials(url=server.url, user=roles.ADMIN, password="wrong")
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await connected(creds, refused_too=True, budget_s=1.0)
    assert time.monotonic() - started >= 1.0  # tried again until the budget was spent


async def test_a_server_that_comes_back_within_the_budget_is_connected_to(server: NatsServer) -> None:
    creds = Credentials(url=server.url, user=roles.ADMIN, password="right")
    server.stop()

    async def restart() -> None:
        await asyncio.sleep(0.8)
        await asyncio.to_thread(server.start)

    back = asyncio.create_task(restart())
    nc = await connected(creds, budget_s=30)
    await back
    assert nc.is_connected
    await nc.close()


async def test_a_question_whose_connection_the_server_closed_is_asked_again_on_a_new_one(
    server: NatsServer,
) -> None:
    # As a reload does to a connection it accepted while reloading (CI: "nats: connection closed" after
    # `corral credentials rotate` had connected with the new password).
    creds = Credentials(url=server.url, user=roles.ADMIN, password="right")
    connections: list[nats.aio.client.Client] = []

    async def ask(nc: nats.aio.client.Client) -> str:
        connections.append(nc)
        if len(connections) == 1:
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(server.start)
        sub = await nc.subscribe("answer")
        await nc.publish("answer", b"42")
        return (await sub.next_msg(timeout=5)).data.decode()

    assert await on_connection(creds, ask, budget_s=30) == "42"
    assert len(connections) == 2 and all(nc.is_closed for nc in connections)


async def test_a_closed_connection_past_the_budget_is_the_error(server: NatsServer) -> None:
    creds = Credentials(url=server.url, user=roles.ADMIN, password="right")

    async def ask(nc: nats.aio.client.Client) -> None:
        await nc.close()
        await nc.publish("answer", b"")

    with pytest.raises(nats.errors.ConnectionClosedError):
        await on_connection(creds, ask, budget_s=1.0)
