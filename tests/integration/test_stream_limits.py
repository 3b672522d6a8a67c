"""The streams take the consumers a large cluster needs (a real nats-server 2.15).

nats-server 2.15 gives every stream that does not set one a limit of 1,000 consumers
(``default_max_consumers``; a limit of -1 or 0 is replaced by that default, though -1 is what the stream's
configuration then reports). Corral makes one consumer per node on the work stream (each
agent's) and one per person on the feed (each user's ``feed-<user>``): the 1,001st node's agent had no
consumer (``declare`` failed with "maximum consumers limit reached"), and the feed service retried the
1,001st user's consumer for ever, publishing nothing more for anyone. ``streams.declare`` now sets the
streams' limit itself (``MAX_CONSUMERS``), and raises it on streams made before.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import pytest
from nats.aio.client import Client
from nats.js import api
from nats.js.errors import NotFoundError

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import MAX_CONSUMERS, connect, declare, feed_reader
from corral.schemas import subjects

pytestmark = pytest.mark.integration

PASSWORD = "admin-secret"
MANY = 1_010  # past the server's default of 1,000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    users = [roles.service_user(roles.ADMIN, PASSWORD)]
    with NatsServer(tmp_path_factory.mktemp("nats"), users) as nats_server:
        yield nats_server


@pytest.fixture
async def admin(server: NatsServer) -> AsyncIterator[Client]:
    """The admin's connection to a server without Corral's streams (each test's own)."""
    nc = await connect(Credentials(url=server.url, user=roles.ADMIN, password=PASSWORD), name="test-admin")
    js = nc.jetstream()
    for stream in (subjects.EVENTS_STREAM, subjects.WORK_STREAM, subjects.FEED_STREAM, subjects.DLQ_STREAM):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(stream)
    try:
        yield nc
    finally:
        await nc.close()


async def test_a_cluster_of_more_than_a_thousand_nodes_has_a_work_consumer_for_each(admin: Client) -> None:
    js = admin.jetstream()
    nodes = [f"n{k:05d}" for k in range(MANY)]
    await declare(js, nodes=nodes)
    info = await js.stream_info(subjects.WORK_STREAM)
    assert info.state.consumer_count == MANY
    assert info.config.max_consumers == MAX_CONSUMERS


async def test_the_feed_takes_a_consumer_for_each_of_more_than_a_thousand_users(admin: Client) -> None:
    js = admin.jetstream()
    await declare(js)
    for k in range(MANY):  # as the feed service does for each user it meets
        name = f"user{k}"
        await js.add_consumer(
            subjects.FEED_STREAM, feed_reader(name, roles.FeedScope(users=(name,)).filters())
        )
    assert (await js.stream_info(subjects.FEED_STREAM)).state.consumer_count == MANY


async def test_declare_raises_the_limit_of_streams_made_with_the_servers_default(admin: Client) -> None:
    js = admin.jetstream()
    for name, subject in (
        (subjects.FEED_STREAM, subjects.FEED_SUBJECTS),
        (subjects.WORK_STREAM, subjects.WORK_SUBJECTS),
    ):
        await js.add_stream(api.StreamConfig(name=name, subjects=[subject]))  # as an older Corral made them
    await declare(js, nodes=[f"n{k:05d}" for k in range(MANY)])
    for name in (subjects.EVENTS_STREAM, subjects.WORK_STREAM, subjects.FEED_STREAM, subjects.DLQ_STREAM):
        assert (await js.stream_info(name)).config.max_consumers == MAX_CONSUMERS, name
    assert (await js.stream_info(subjects.WORK_STREAM)).state.consumer_count == MANY
