"""An agent reads its node's orders only, through the consumer the admin created (a real nats-server).

A launch order holds another user's script and environment. Before, an agent's role let it create and
update its own durable consumer, so agent node1 could point it at ``corral.work.node2`` and read node2's
orders. Now ``streams.declare`` creates each node's consumer filtered on its own work subject, the agent role
may not create or update any consumer, and the agent binds to its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import NotFoundError

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import WORK_MAX_AGE_S, connect, declare
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.agent.records import LAG_MARGIN_S, RETENTION_S

pytestmark = pytest.mark.integration

AGENT = roles.agent_role("node1")
PASSWORDS = {roles.ADMIN: "admin-secret", roles.SCHEDULER: "scheduler-secret", AGENT: "agent-secret"}
NODES = ["node1", "node2"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    users = [
        roles.agent_user("node1", PASSWORDS[AGENT]),
        roles.service_user(roles.ADMIN, PASSWORDS[roles.ADMIN]),
        roles.service_user(roles.SCHEDULER, PASSWORDS[roles.SCHEDULER]),
    ]
    with NatsServer(Path(tmp_path_factory.mktemp("nats")), users) as nats_server:
        yield nats_server


@pytest.fixture
async def buses(server: NatsServer) -> AsyncIterator[dict[str, Bus]]:
    """Fresh streams and work consumers (the admin's declaration); a bus of each role; one order per node."""
    opened = {}
    for role, password in PASSWORDS.items():
        nc = await connect(Credentials(url=server.url, user=role, password=password), name=f"test-{role}")
        opened[role] = Bus(nc, actor=role)
    admin = opened[roles.ADMIN].js
    for stream in (subjects.EVENTS_STREAM, subjects.DLQ_STREAM, subjects.WORK_STREAM):
        with contextlib.suppress(NotFoundError):
            await admin.delete_stream(stream)
    await declare(admin, nodes=NODES)
    for node in NODES:
        await opened[roles.SCHEDULER].publish_order(
            subjects.work_subject(node), node.encode(), f"order-{node}"
        )
    try:
        yield opened
    finally:
        for bus in opened.values():
            await bus.nc.close()


async def filter_of(bus: Bus, node: str) -> str | None:
    info = await bus.js.consumer_info(subjects.WORK_STREAM, subjects.work_consumer(node))
    return info.config.filter_subject


async def test_the_agent_consumes_its_own_orders_through_the_admins_consumer(buses: dict[str, Bus]) -> None:
    got: list[bytes] = []
    stop = asyncio.Event()

    async def handle(msgs: list[Msg]) -> None:
        got.extend(msg.data for msg in msgs)
        stop.set()

    agent = buses[AGENT]
    consume = agent.consume(
        subjects.WORK_STREAM,
        subjects.work_consumer("node1"),
        subjects.work_subject("node1"),
        handle,
        service=AGENT,
        stop=stop,
        bind=True,
    )
    await asyncio.wait_for(consume, 15)
    assert got == [b"node1"]


#: What agent node1 might try, to read node2's orders.
ATTEMPTS = {
    "re-point its own consumer": api.ConsumerConfig(
        durable_name=subjects.work_consumer("node1"), filter_subject=subjects.work_subject("node2")
    ),
    "take over node2's": api.ConsumerConfig(
        durable_name=subjects.work_consumer("node2"), filter_subject=subjects.work_subject("node2")
    ),
    "a consumer of its own": api.ConsumerConfig(
        durable_name=f"{AGENT}-2", filter_subject=subjects.work_subject("node2")
    ),
    "an ephemeral consumer": api.ConsumerConfig(filter_subject=subjects.work_subject("node2")),
}


@pytest.mark.parametrize("config", list(ATTEMPTS.values()), ids=list(ATTEMPTS))
async def test_an_agent_may_not_create_or_change_a_consumer(
    buses: dict[str, Bus], config: api.ConsumerConfig
) -> None:
    agent = buses[AGENT].nc.jetstream(timeout=1.0)
    # The server refuses the request's publish (a permissions violation): no JetStream answer comes.
    with pytest.raises(nats.errors.TimeoutError):
        await agent.add_consumer(subjects.WORK_STREAM, config)
    admin = buses[roles.ADMIN]
    assert [await filter_of(admin, node) for node in NODES] == [subjects.work_subject(n) for n in NODES]
    names = [c.name for c in await admin.js.consumers_info(subjects.WORK_STREAM)]
    assert sorted(names) == [subjects.work_consumer(n) for n in NODES]


async def test_an_agent_cannot_fetch_another_nodes_orders(buses: dict[str, Bus]) -> None:
    agent = buses[AGENT].nc.jetstream(timeout=1.0)
    psub = await agent.pull_subscribe_bind(
        durable=subjects.work_consumer("node2"), stream=subjects.WORK_STREAM
    )
    with pytest.raises(TimeoutError):  # nats-py raises nats.errors.TimeoutError or asyncio.TimeoutError
        await psub.fetch(1, timeout=1.0)
    info = await buses[roles.ADMIN].js.consumer_info(subjects.WORK_STREAM, subjects.work_consumer("node2"))
    assert info.num_pending == 1 and info.num_ack_pending == 0  # node2's order is still there, undelivered


async def test_declaring_again_pins_a_changed_filter_back(buses: dict[str, Bus]) -> None:
    admin = buses[roles.ADMIN]
    await admin.js.add_consumer(subjects.WORK_STREAM, ATTEMPTS["re-point its own consumer"])
    assert await filter_of(admin, "node1") == subjects.work_subject("node2")
    await declare(admin.js, nodes=NODES)
    assert await filter_of(admin, "node1") == subjects.work_subject("node1")


@pytest.mark.parametrize("config", list(ATTEMPTS.values()), ids=list(ATTEMPTS))
async def test_a_service_may_not_create_a_consumer_on_the_work_stream(
    buses: dict[str, Bus], config: api.ConsumerConfig
) -> None:
    # A service's JetStream rights cover its own consumers of the log and the buckets, not the work stream.
    scheduler = buses[roles.SCHEDULER].nc.jetstream(timeout=1.0)
    with pytest.raises(nats.errors.TimeoutError):
        await scheduler.add_consumer(subjects.WORK_STREAM, config)
    psub = await scheduler.pull_subscribe_bind(
        durable=subjects.work_consumer("node2"), stream=subjects.WORK_STREAM
    )
    with pytest.raises(TimeoutError):  # nats-py raises nats.errors.TimeoutError or asyncio.TimeoutError
        await psub.fetch(1, timeout=1.0)
    names = [c.name for c in await buses[roles.ADMIN].js.consumers_info(subjects.WORK_STREAM)]
    assert sorted(names) == [subjects.work_consumer(n) for n in NODES]
    # Its own consumers of the log still work (an ordered replay, as the scheduler's follower makes).
    appended = await buses[roles.ADMIN].append(ev.NodeDrainRequested(node="node1", user="root", reason="x"))
    assert [e.seq async for e in buses[roles.SCHEDULER].read(appended.seq)] == [appended.seq]


async def test_an_order_comes_again_for_as_long_as_the_work_stream_keeps_it(buses: dict[str, Bus]) -> None:
    """What the agent's records' retention rests on (``services/agent/records.py``): a copy of an order can
    reach the agent as long as the work stream keeps it, acked or not, so a run's record outlives that."""
    admin = buses[roles.ADMIN].js
    stream = await admin.stream_info(subjects.WORK_STREAM)
    assert stream.config.max_age == WORK_MAX_AGE_S
    assert stream.config.max_age + LAG_MARGIN_S <= RETENTION_S
    consumer = await admin.consumer_info(subjects.WORK_STREAM, subjects.work_consumer("node1"))
    assert consumer.config.max_deliver in (None, -1)  # unacked, it comes again every ack_wait, for ever
    agent = buses[AGENT].nc.jetstream(timeout=2.0)
    durable, stream_name = subjects.work_consumer("node1"), subjects.WORK_STREAM
    psub = await agent.pull_subscribe_bind(durable=durable, stream=stream_name)
    (order,) = await psub.fetch(1, timeout=5.0)
    await order.ack_sync()
    with pytest.raises(TimeoutError):  # nats-py raises nats.errors.TimeoutError or asyncio.TimeoutError
        await psub.fetch(1, timeout=1.0)
    await psub.unsubscribe()
    # The node's consumer recreated (deleted, declared again): every order the stream keeps comes again.
    await admin.delete_consumer(stream_name, durable)
    await declare(admin, nodes=NODES)
    psub = await agent.pull_subscribe_bind(durable=durable, stream=stream_name)
    (again,) = await psub.fetch(1, timeout=5.0)
    assert again.data == order.data == b"node1"
