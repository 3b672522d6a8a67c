"""The feed service on a real nats-server: each reader sees its own jobs only, and two replicas, a restart or
a crash between two messages of one entry publish every message once, in the log's order.

Readers may not create consumers: a consumer's body may make it a push consumer, and the server delivers
its messages on the deliver subject with its own rights, whatever the creator's (measured with nats-server
2.15: a consumer of the feed created with ``deliver_subject=corral.evt.job.9.job_completed`` appended to the
log). So the feed service makes each person's consumer ``feed-<user>``, and the reader only binds to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.js import api
from nats.js.errors import NotFoundError

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.pipeline import Pipeline
from corral.libs.runtime.streams import connect, declare
from corral.schemas import codec, feed, subjects
from corral.schemas import events as ev
from corral.schemas.job_spec import ArrayRange, ArraySpec, JobSpec
from corral.services.feed.app import FeedService
from corral.services.feed.project import Projector

pytestmark = pytest.mark.integration

PEOPLE = ("alice", "bob")
PASSWORDS = {
    roles.ADMIN: "admin-pw",
    roles.FEED: "feed-pw",
    roles.AUDITOR: "auditor-pw",
    "alice": "a-pw",
    "bob": "b-pw",
}
SPEC = JobSpec(name="train", script="#!/bin/sh\ntrue\n", workdir="/tmp", account="ml")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    users = [
        roles.service_user(roles.ADMIN, PASSWORDS[roles.ADMIN]),
        roles.service_user(roles.FEED, PASSWORDS[roles.FEED]),
        roles.auditor_user(PASSWORDS[roles.AUDITOR]),
        *(roles.user_user(name, PASSWORDS[name]) for name in PEOPLE),
    ]
    with NatsServer(Path(tmp_path_factory.mktemp("nats")), users) as nats_server:
        yield nats_server


class Errors:
    """The asynchronous errors (permission violations) a connection was told of."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, exc: Exception) -> None:
        """The connection's error callback."""
        self.seen.append(str(exc))


async def login(server: NatsServer, name: str, errors: Errors | None = None) -> Client:
    creds = Credentials(url=server.url, user=name, password=PASSWORDS[name])
    if errors is None:
        return await connect(creds, name=f"test-{name}")
    return await nats.connect(
        server.url,
        user=name,
        password=PASSWORDS[name],
        inbox_prefix=subjects.inbox_prefix(name),
        error_cb=errors.record,
    )


@pytest.fixture
async def admin(server: NatsServer) -> AsyncIterator[Bus]:
    """Fresh streams (the auditor's feed consumer declared), and the admin's bus to append with."""
    nc = await login(server, roles.ADMIN)
    for stream in (subjects.EVENTS_STREAM, subjects.FEED_STREAM, subjects.DLQ_STREAM, subjects.WORK_STREAM):
        with contextlib.suppress(NotFoundError):
            await nc.jetstream().delete_stream(stream)
    await declare(nc.jetstream(), feed_readers={roles.AUDITOR: roles.FeedScope(everyone=True).filters()})
    bus = Bus(nc, actor=roles.ADMIN)
    await bus.append(ev.NodeRegistered(node="node1", cpus=8, mem_mb=1024, partitions=["gpu"]))
    yield bus
    await nc.close()


async def lifecycle(bus: Bus, job_id: int, user: str) -> None:
    """A job's submission, start and end in the log."""
    await bus.append(ev.JobSubmitted(job_id=job_id, user=user, spec=SPEC))
    node = ev.NodeAllocation(node="node1", gpus=[], cpus=1)
    await bus.append(
        ev.JobAllocated(job_id=job_id, attempt=0, partition="gpu", allocations=[node], time_limit_s=None)
    )
    await bus.append(ev.JobCompleted(job_id=job_id, attempt=0))


@contextlib.asynccontextmanager
async def feed_services(server: NatsServer, count: int) -> AsyncIterator[None]:
    """``count`` feed replicas at once, each with its own connection."""
    stop = asyncio.Event()
    conns = [await login(server, roles.FEED) for _ in range(count)]
    tasks = [asyncio.create_task(FeedService(Bus(nc, actor=roles.FEED)).run(stop)) for nc in conns]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for nc in conns:
            await nc.close()


async def feed_messages(bus: Bus, count: int, timeout: float = 20.0) -> list[tuple[str, feed.FeedMessage]]:
    """The feed's messages once it holds ``count`` (and a moment more, to see any extra)."""
    js = bus.js
    deadline = asyncio.get_running_loop().time() + timeout
    while (await js.stream_info(subjects.FEED_STREAM)).state.messages < count:
        assert asyncio.get_running_loop().time() < deadline, "the feed did not fill in time"
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    last = (await js.stream_info(subjects.FEED_STREAM)).state.last_seq
    out = []
    for seq in range(1, last + 1):
        raw = await js.get_msg(subjects.FEED_STREAM, seq=seq)
        out.append((raw.subject or "", codec.decode(raw.data or b"", feed.FeedMessage)))
    return out


async def read_own(server: NatsServer, name: str, count: int) -> list[str]:
    """Subjects ``name`` reads from its own consumer ``feed-<name>``, as a reader binds to it."""
    nc = await login(server, name)
    try:
        sub = await nc.jetstream().pull_subscribe_bind(
            durable=subjects.feed_consumer(name), stream=subjects.FEED_STREAM
        )
        got: list[str] = []
        while len(got) < count:
            for msg in await sub.fetch(count - len(got), timeout=5.0):
                got.append(msg.subject)
                await msg.ack()
        # nats-py raises nats.errors.TimeoutError, or asyncio.TimeoutError when the fetch's time ran out
        # before its waiting request was sent (CI on a busy machine): both are the builtin TimeoutError.
        with contextlib.suppress(TimeoutError):
            got += [m.subject for m in await sub.fetch(10, timeout=1.0)]
        return got
    finally:
        await nc.close()


async def test_two_replicas_publish_each_message_once_in_log_order(server: NatsServer, admin: Bus) -> None:
    await lifecycle(admin, 1, "alice")
    async with feed_services(server, 2):
        await lifecycle(admin, 2, "bob")
        messages = await feed_messages(admin, 6)
    kinds = [(m.event.job_id, type(m.event).__struct_config__.tag) for _, m in messages]  # type: ignore[union-attr]
    assert kinds == [
        (1, "submitted"),
        (1, "started"),
        (1, "ended"),
        (2, "submitted"),
        (2, "started"),
        (2, "ended"),
    ]
    assert [m.log_seq for _, m in messages] == sorted(m.log_seq for _, m in messages)
    assert messages[0][0] == "corral.feed.v1.job.ml.alice.1.submitted"


async def test_a_restart_after_a_crash_between_two_messages_adds_only_the_missing_ones(
    server: NatsServer, admin: Bus
) -> None:
    spec = msgspec.structs.replace(SPEC, array=ArraySpec(ranges=[ArrayRange(start=0, end=2)]))
    appended = await admin.append(ev.JobSubmitted(job_id=7, user="alice", spec=spec))
    # The crash: the first task's message is out (as the service publishes it), the two others are not.
    projector = Projector()
    registration = (await admin.entry(1)).envelope
    assert registration is not None
    projector.add(1, registration)
    first = projector.add(appended.seq, appended.envelope)[0]
    await admin.js.publish(first.subject, codec.encode(first.message), headers={"Nats-Msg-Id": first.msg_id})
    async with feed_services(server, 1):
        messages = await feed_messages(admin, 3)
    assert [m.event.job_id for _, m in messages] == [7, 8, 9]  # type: ignore[union-attr]
    async with feed_services(server, 1):  # a plain restart adds nothing
        assert len(await feed_messages(admin, 3)) == 3


async def test_each_person_reads_their_own_jobs_and_the_auditor_every_job(
    server: NatsServer, admin: Bus
) -> None:
    async with feed_services(server, 1):
        await lifecycle(admin, 1, "alice")
        await lifecycle(admin, 2, "bob")
        await feed_messages(admin, 6)
    assert await read_own(server, "alice", 3) == [
        f"corral.feed.v1.job.ml.alice.1.{k}" for k in ("submitted", "started", "ended")
    ]
    assert await read_own(server, "bob", 3) == [
        f"corral.feed.v1.job.ml.bob.2.{k}" for k in ("submitted", "started", "ended")
    ]
    assert len(await read_own(server, roles.AUDITOR, 6)) == 6


async def test_alice_cannot_read_bob_s_feed_nor_make_a_consumer(server: NatsServer, admin: Bus) -> None:
    async with feed_services(server, 1):
        await lifecycle(admin, 2, "bob")
        await feed_messages(admin, 3)
    errors = Errors()
    nc = await login(server, "alice", errors)
    try:
        # Core subscriptions to bob's subjects, or to the whole feed: refused by the server.
        for subject in ("corral.feed.v1.job.ml.bob.>", "corral.feed.v1.>", "corral.feed.v1.job.*.*.>"):
            await nc.subscribe(subject)
        await nc.flush()
        await asyncio.sleep(0.3)
        assert sum("permissions violation for subscription" in e for e in errors.seen) == 3, errors.seen
        # bob's consumer: neither its messages nor its info.
        for api_subject, body in (
            (
                f"$JS.API.CONSUMER.MSG.NEXT.{subjects.FEED_STREAM}.feed-bob",
                b'{"batch": 10, "expires": 500000000}',
            ),
            (f"$JS.API.CONSUMER.INFO.{subjects.FEED_STREAM}.feed-bob", b""),
        ):
            with pytest.raises(nats.errors.TimeoutError):
                await nc.request(api_subject, body, timeout=1.0)
        # No consumer of her own either, not even filtered on her jobs: its body could deliver anywhere.
        config = {
            "name": "mine",
            "filter_subject": "corral.feed.v1.job.*.alice.>",
            "deliver_subject": "corral.hb.node1",
        }
        create = f"$JS.API.CONSUMER.CREATE.{subjects.FEED_STREAM}.mine.corral.feed.v1.job.*.alice.>"
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(
                create,
                json.dumps({"stream_name": subjects.FEED_STREAM, "config": config}).encode(),
                timeout=1.0,
            )
        with pytest.raises(nats.errors.TimeoutError):
            await nc.jetstream().add_consumer(
                subjects.FEED_STREAM,
                api.ConsumerConfig(name="x", filter_subject="corral.feed.v1.job.*.bob.>"),
                timeout=1.0,
            )
        await asyncio.sleep(0.3)
        assert sum("permissions violation for publish" in e for e in errors.seen) == 4, errors.seen
        assert (
            await admin.js.stream_info(subjects.FEED_STREAM)
        ).state.consumer_count == 2  # auditor's, bob's
    finally:
        await nc.close()


async def test_a_message_the_stream_does_not_take_mid_window_keeps_the_feed_in_log_order(
    server: NatsServer, admin: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages go out many at once, each naming the one before it: when one is refused (the second job's
    submission, once), the stream takes none after it, and the window is published again from it in order;
    the feed holds every message once, in the log's order."""
    for job_id in range(1, 6):
        await lifecycle(admin, job_id, "alice")
    real = Pipeline.publish
    refused: list[str] = []

    async def flaky(self: Pipeline, subject: str, data: bytes, headers: dict[str, str]) -> api.PubAck:
        if headers["Nats-Msg-Id"] == "feed:5:0" and not refused:  # job 2's submission (log entry 5)
            refused.append(subject)
            raise TimeoutError("no acknowledgement came")
        return await real(self, subject, data, headers)

    monkeypatch.setattr(Pipeline, "publish", flaky)
    async with feed_services(server, 1):
        messages = await feed_messages(admin, 15)
    assert refused  # the refusal happened, with later messages of the window out behind it
    kinds = [(m.event.job_id, type(m.event).__struct_config__.tag) for _, m in messages]  # type: ignore[union-attr]
    assert kinds == [(j, tag) for j in range(1, 6) for tag in ("submitted", "started", "ended")]
    assert [m.log_seq for _, m in messages] == sorted(m.log_seq for _, m in messages)
