"""The scheduler lease on a real nats-server, as the scheduler role: two processes' ``Leadership`` never both
lead; a clean stop hands over at the next poll; a crash (no release) hands over one TTL later, with the
epoch bumped past the log's; ``roster`` lists both."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from paused import pause

from corral.libs.core import lease
from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.schemas import subjects
from corral.services.scheduler.leadership import Leadership

pytestmark = pytest.mark.integration

TTL = 1.0
PASSWORD = "scheduler-secret"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    users = [roles.service_user(roles.ADMIN, "admin-secret"), roles.service_user(roles.SCHEDULER, PASSWORD)]
    nats = NatsServer(tmp_path / "nats", users)
    nats.start()
    yield nats
    nats.stop()


@pytest.fixture
async def schedulers(server: NatsServer) -> AsyncIterator[list[Client]]:
    admin = await connect(
        Credentials(url=server.url, user=roles.ADMIN, password="admin-secret"), name="admin"
    )
    await declare(admin.jetstream())
    await admin.drain()
    creds = Credentials(url=server.url, user=roles.SCHEDULER, password=PASSWORD)
    clients = [await connect(creds, name=f"scheduler-{i}") for i in range(2)]
    yield clients
    for nc in clients:
        # (one may still be reconnecting to a server a test killed and started again)
        await (nc.drain() if nc.is_connected else nc.close())


class Running:
    """One process's ``Leadership`` running as the scheduler runs it."""

    def __init__(self, nc: Client, name: str, floor: int = 0) -> None:
        self.leadership = Leadership(nc.jetstream(), name, TTL, lambda: floor)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.leadership.run(self.stop))

    async def stopped(self) -> None:
        """A clean stop: the lease is released."""
        self.stop.set()
        await self.task

    async def crashed(self) -> None:
        """A death: the task ends without releasing anything."""
        self.leadership.release = _nothing  # type: ignore[method-assign]
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _nothing() -> None:
    return None


async def until(condition: object, timeout: float) -> float:
    """Seconds until ``condition()`` holds (polled every 10 ms); fails after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():  # type: ignore[operator]
            return time.monotonic() - started
        await asyncio.sleep(0.01)
    raise AssertionError(f"not in {timeout}s")


async def test_one_leader_and_a_handover_on_a_clean_stop(schedulers: list[Client]) -> None:
    a = Running(schedulers[0], "a")
    await until(a.leadership.leading, 2.0)
    b = Running(schedulers[1], "b")
    for _ in range(int(3 * TTL / 0.01)):  # three TTLs: renewals go on, b never takes over
        assert not b.leadership.leading()
        await asyncio.sleep(0.01)
    assert a.leadership.leading() and a.leadership.epoch == 1
    assert await a.leadership.roster() == [("a", "primary", True), ("b", "backup", True)]
    await a.stopped()
    assert await until(b.leadership.leading, 2.0) < 3 * lease.poll_s(TTL)
    assert b.leadership.epoch == 2
    await b.stopped()


async def test_a_crashed_leader_is_replaced_a_ttl_later_past_the_logs_epoch(
    schedulers: list[Client],
) -> None:
    a = Running(schedulers[0], "a")
    await until(a.leadership.leading, 2.0)
    b = Running(schedulers[1], "b", floor=7)  # its fold saw epoch 7 in the log
    await asyncio.sleep(0.3)
    await a.crashed()
    waited = await until(b.leadership.leading, 3 * TTL)
    assert TTL - 0.4 <= waited <= TTL + 3 * lease.poll_s(TTL)
    assert not a.leadership.leading()  # its own clock tells it so, without a read
    assert b.leadership.epoch == 8
    await b.stopped()


async def test_two_takers_of_one_lapsed_lease_one_wins(schedulers: list[Client]) -> None:
    both = [Running(nc, f"s{i}") for i, nc in enumerate(schedulers)]
    await until(lambda: any(r.leadership.leading() for r in both), 2.0)
    for _ in range(100):
        assert sum(r.leadership.leading() for r in both) == 1
        await asyncio.sleep(0.01)
    for r in both:
        await r.stopped()


async def test_a_read_or_write_whose_reply_does_not_come_is_given_up_after_a_third_of_the_lease(
    server: NatsServer, schedulers: list[Client]
) -> None:
    # A JetStream request whose reply never comes (its stream's leader was on a NATS server that died: the
    # chaos test's leader lost its lease waiting 10 s for one) must be given up while the lease still holds,
    # to be sent again at the next poll. A stopped server (SIGSTOP) answers nothing, as that one.
    leadership = Leadership(schedulers[0].jetstream(), "a", TTL, lambda: 0)
    await leadership.read()  # (the bucket found)
    pid = server.pid
    assert pid is not None
    pause(pid)
    try:
        for operation in (leadership.read, lambda: leadership.write(1)):
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await operation()
            # given up while the lease would still hold (a third of it; the connection's default: 5-10 s)
            assert time.monotonic() - started < TTL
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_reading_the_presences_often_leaves_no_consumer_behind(schedulers: list[Client]) -> None:
    # An accounting holder reads them four times a second: what each read makes must go with it (nats-py's
    # KeyValue.keys left a consumer per call; past a few hundred the server refused them).
    a = Leadership(schedulers[0].jetstream(), "a", TTL, lambda: 0)
    b = Leadership(schedulers[1].jetstream(), "b", TTL, lambda: 0)
    await a.beat()
    await b.beat()
    await b.release()  # its presence deleted: a delete marker is no presence
    for _ in range(600):
        values = await a.entries("member.")
    assert [json.loads(value)["name"] for value in values] == ["a"]
    info = await schedulers[0].jetstream().stream_info(f"KV_{subjects.LEADER_BUCKET}")
    assert info.state.consumer_count == 0
