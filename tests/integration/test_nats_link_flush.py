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


async def test_the_round_trip_goes_out_after_what_was_sent_before_it(own_nats: NatsServer) -> None:
    """nats-py's ``nc.flush`` writes its PING to the socket before the SUB or PUB still in its buffer, so its
    PONG can come before the server has them (a subscriber then misses the next message). ``nats_link.flush``
    sends the buffered commands first: the bytes reach the socket in the order they were sent."""
    nc = await nats.connect(own_nats.url, user=USER.user, password=USER.password)
    written: list[bytes] = []
    transport = nc._transport
    write, writelines = transport.write, transport.writelines

    def record_write(data: bytes) -> None:
        written.append(bytes(data))
        write(data)

    def record_writelines(lines: list[bytes]) -> None:
        written.extend(bytes(line) for line in lines)
        writelines(lines)

    transport.write, transport.writelines = record_write, record_writelines  # type: ignore[method-assign]
    try:
        sub = await nc.subscribe("orders.node1")
        assert await nats_link.flush(nc, 5)
        stream = b"".join(written)
        assert stream.index(b"SUB orders.node1") < stream.index(b"PING\r\n"), stream
        other = await nats.connect(own_nats.url, user=USER.user, password=USER.password)
        try:
            await other.publish("orders.node1", b"first")
            assert await nats_link.flush(other, 5)
            assert (await sub.next_msg(timeout=5)).data == b"first"
        finally:
            await other.close()
    finally:
        transport.write, transport.writelines = write, writelines  # type: ignore[method-assign]
        await nc.close()
