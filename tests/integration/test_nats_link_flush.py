"""``nats_link.flush`` against a real nats-server paused with SIGSTOP: a round trip that timed out does not
break the connection when the server resumes (``nc.flush`` does: nats-py's read loop dies of the late
PONG)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg
from paused import pause

from corral.libs.infra import NatsServer, NatsUser
from corral.libs.runtime import nats_link

pytestmark = pytest.mark.integration

USER = NatsUser("admin", "admin-secret", publish=[">"], subscribe=[">"])


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(tmp_path / "nats", [USER]) as server:
        yield server


async def test_a_round_trip_that_timed_out_on_a_paused_server_leaves_the_connection_working(
    own_nats: NatsServer,
) -> None:
    assert own_nats.pid is not None
    nc = await nats.connect(own_nats.url, user=USER.user, password=USER.password)
    got: list[bytes] = []

    async def on_msg(msg: Msg) -> None:
        got.append(msg.data)

    await nc.subscribe("probe.test", cb=on_msg)
    try:
        assert await nats_link.flush(nc, 1)
        pause(own_nats.pid)
        try:
            assert not await nats_link.flush(nc, 1)
        finally:
            os.kill(own_nats.pid, signal.SIGCONT)
        await asyncio.sleep(0.3)  # the late PONG arrives
        assert await nats_link.flush(nc, 2)
        await nc.publish("probe.test", b"after")
        assert await nats_link.flush(nc, 2)
        await asyncio.sleep(0.1)
        assert got == [b"after"]  # the read loop still runs
    finally:
        await nc.close()
