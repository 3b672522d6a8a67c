"""A step's I/O subjects name the node of the task (``steps.io_subject``), and the agent role pins that token:
an agent speaks only for its own node's tasks and hears only its own node's stdin, so a compromised agent can
neither write into another node's tasks' output nor read another user's stdin sent to another node. (Each
round trip is ``nats_link.flush``: nats-py's ``flush`` may be answered before the SUB or PUB sent before it
reaches the server, and a message published right after was then missed, 1 run in ~40.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime import nats_link
from corral.schemas.steps import io_source, io_subject

pytestmark = pytest.mark.integration


class Conn:
    """A connection of one role and the server's errors it was told of."""

    def __init__(self, nc: Client, errors: asyncio.Queue[Exception]) -> None:
        self.nc, self.errors = nc, errors

    async def violation(self) -> str:
        return str(await asyncio.wait_for(self.errors.get(), timeout=5)).lower()


@pytest.fixture
async def conns(tmp_path: Path) -> AsyncIterator[dict[str, Conn]]:
    users = {
        "node1": roles.agent_user("node1", "p1"),
        "node2": roles.agent_user("node2", "p2"),
        "alice": roles.user_user("alice", "pa"),
        "bob": roles.user_user("bob", "pb"),
    }
    with NatsServer(tmp_path / "nats", list(users.values())) as server:
        out: dict[str, Conn] = {}
        for name, user in users.items():
            errors: asyncio.Queue[Exception] = asyncio.Queue()

            async def on_error(error: Exception, errors: asyncio.Queue[Exception] = errors) -> None:
                await errors.put(error)

            nc = await nats.connect(server.url, user=user.user, password=user.password, error_cb=on_error)
            out[name] = Conn(nc, errors)
        try:
            yield out
        finally:
            for conn in out.values():
                await conn.nc.close()


async def test_an_agent_writes_output_only_for_its_own_nodes_tasks(conns: dict[str, Conn]) -> None:
    alice = await conns["alice"].nc.subscribe("corral.io.alice.k1.>")
    assert await nats_link.flush(conns["alice"].nc, 5)
    node1 = conns["node1"].nc
    await node1.publish(io_subject("alice", "k1", "out", 0, "node2"), b"forged\n")
    await node1.publish(io_subject("alice", "k1", "exit", 1, "node2"), b"{}")
    assert await nats_link.flush(node1, 5)
    assert "permissions violation for publish" in await conns["node1"].violation()
    await node1.publish(io_subject("alice", "k1", "out", 0, "node1"), b"mine\n")
    assert await nats_link.flush(node1, 5)
    msg = await alice.next_msg(timeout=5)
    assert (msg.subject, msg.data) == (io_subject("alice", "k1", "out", 0, "node1"), b"mine\n")
    with pytest.raises(nats.errors.TimeoutError):
        await alice.next_msg(timeout=0.3)


async def test_an_agent_hears_only_its_own_nodes_stdin(conns: dict[str, Conn]) -> None:
    node1 = conns["node1"].nc
    await node1.subscribe(io_subject("*", "*", "in", None, "node2"))
    assert await nats_link.flush(node1, 5)
    assert "permissions violation for subscription" in await conns["node1"].violation()
    mine = await node1.subscribe(io_subject("*", "*", "in", None, "node1"))
    assert await nats_link.flush(node1, 5)
    await conns["alice"].nc.publish(io_subject("alice", "k1", "in", None, "node1"), b"secret")
    assert await nats_link.flush(conns["alice"].nc, 5)
    assert (await mine.next_msg(timeout=5)).data == b"secret"


async def test_a_user_neither_reads_nor_feeds_another_users_step(conns: dict[str, Conn]) -> None:
    bob = conns["bob"].nc
    await bob.subscribe("corral.io.alice.>")
    assert await nats_link.flush(bob, 5)
    assert "permissions violation for subscription" in await conns["bob"].violation()
    await bob.publish(io_subject("alice", "k1", "in", None, "node1"), b"x")
    assert await nats_link.flush(bob, 5)
    assert "permissions violation for publish" in await conns["bob"].violation()


def test_srun_and_the_batch_node_take_a_message_only_from_the_tasks_node() -> None:
    nodes = {0: "node1", 1: "node2"}
    assert io_source(io_subject("alice", "k", "out", 0, "node1"), nodes) == ("out", 0)
    assert io_source(io_subject("alice", "k", "exit", 1, "node2"), nodes) == ("exit", 1)
    assert io_source(io_subject("alice", "k", "exit", 1, "node1"), nodes) is None  # node1 for node2's task
    assert io_source(io_subject("alice", "k", "out", 7, "node1"), nodes) is None  # no such task
    assert io_source(io_subject("alice", "k", "in", None, "node1"), nodes) is None
    assert io_source("corral.io.alice.k.out.0", nodes) is None  # the old form, no node
