"""A log entry that makes a fold handler raise never stops the scheduler (a real nats-server).

The poison entry here is a conclusion dated absurdly late (1e308 s): billing the run's two GPUs for that
long is infinite, and ``fair_share.charge`` raises. Before, the exception escaped the follow loop (the
service stopped) and every restart replayed into the same entry. Now the entry is skipped, counted,
dead-lettered once and logged once, and the scheduler goes on scheduling, live and after a restart from
the log or from a snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError
from structlog.testing import capture_logs

from corral.libs.config.cluster import parse_config
from corral.libs.core.state import encode_state
from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.scheduler import snapshot
from corral.services.scheduler.app import DEAD_LETTERS, Scheduler

pytestmark = pytest.mark.integration

PASSWORDS = {roles.ADMIN: "admin-secret", roles.SCHEDULER: "scheduler-secret"}
CONFIG = parse_config("""
[[nodes]]
names = "pn[1-2]"
cpus = 8
memory = "16G"
gpus = 4
""")
SPEC = ev.JobSpec(name="p", script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=2, nodes=1)
POISON_LOG = "skipped a poison log entry"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    users = [roles.service_user(role, password) for role, password in PASSWORDS.items()]
    with NatsServer(Path(tmp_path_factory.mktemp("nats")), users) as nats_server:
        yield nats_server


@pytest.fixture
async def buses(server: NatsServer) -> AsyncIterator[tuple[Bus, Bus]]:
    """Empty streams; an admin bus (to append what the test plays) and the scheduler role's bus."""
    connections = []
    for role in (roles.ADMIN, roles.SCHEDULER):
        creds = Credentials(url=server.url, user=role, password=PASSWORDS[role])
        connections.append(await connect(creds, name=f"test-{role}"))
    admin = connections[0].jetstream()
    for stream in (subjects.EVENTS_STREAM, subjects.DLQ_STREAM, subjects.WORK_STREAM):
        with contextlib.suppress(NotFoundError):
            await admin.delete_stream(stream)
    with contextlib.suppress(NotFoundError):
        await admin.delete_object_store(subjects.SNAPSHOT_BUCKET)
    await declare(admin)
    try:
        yield Bus(connections[0], actor="test"), Bus(connections[1], actor=roles.SCHEDULER)
    finally:
        for nc in connections:
            await nc.close()


class Running:
    """A scheduler following the log in a task of its own."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(scheduler.follow(self.stop))

    async def started(self, bus: Bus, job_id: int) -> float:
        """Wait until ``job_id`` runs; its start time. Fails at once if the follow loop died."""
        for _ in range(300):
            if self.task.done():
                self.task.result()
                raise AssertionError("the scheduler stopped")
            job = self.scheduler.state.jobs.get(job_id)
            if job is not None and job.state == "RUNNING" and job.start_time is not None:
                return job.start_time
            await asyncio.sleep(0.05)
        raise AssertionError(f"job {job_id} was never started")

    async def settled(self, bus: Bus) -> None:
        """Wait until the whole log is applied and nothing is in flight."""
        for _ in range(300):
            last = await bus.last_seq()
            s = self.scheduler
            if s.state.last_seq >= last and s.inflight <= last and not s.lock.locked():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the scheduler did not catch up")

    async def close(self) -> None:
        self.stop.set()
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def dead_letters(bus: Bus) -> list[Any]:
    """The scheduler's dead letters, oldest first."""
    info = await bus.js.stream_info(subjects.DLQ_STREAM)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(NotFoundError):
            msg = await bus.js.get_msg(subjects.DLQ_STREAM, seq=seq)
            if msg.subject == subjects.dlq_subject(DEAD_LETTERS):
                found.append(msg)
    return found


def poison_logs(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == POISON_LOG]


async def test_a_poison_entry_is_skipped_and_scheduling_goes_on_also_after_restarts(
    buses: tuple[Bus, Bus],
) -> None:
    admin, bus = buses
    with capture_logs() as live_logs:
        live = await follow(Scheduler(bus, CONFIG), use_snapshot=False)
        for name in ("pn1", "pn2"):
            node = ev.NodeRegistered(node=name, cpus=8, mem_mb=16384, gpus=4, partitions=["batch"])
            await admin.append(node)
        await admin.append(ev.JobSubmitted(job_id=1, user="alice", spec=SPEC))
        await live.started(admin, 1)
        await live.settled(admin)
        await snapshot.save(bus, live.scheduler.state)  # a snapshot from before the poison entry

        poison = await admin.append(ev.JobCompleted(job_id=1, attempt=0), occurred_at=1e308)
        await admin.append(ev.JobSubmitted(job_id=2, user="alice", spec=SPEC))
        await live.started(admin, 2)
        await live.settled(admin)
        await live.close()
    assert live.scheduler.state.skipped == 1
    assert live.scheduler.state.jobs[1].state == "RUNNING"  # the skipped conclusion changed nothing
    (letter,) = await dead_letters(admin)
    assert letter.headers["Corral-Seq"] == str(poison.seq)
    assert "ValueError" in letter.headers["Corral-Reason"]
    assert letter.headers["Corral-Subject"] == subjects.job_subject(1, "job_completed")
    assert len(poison_logs(live_logs)) == 1

    stored, _ = await snapshot.load(bus)
    assert stored is not None and stored.last_seq < poison.seq
    for job_id, use_snapshot in ((3, False), (4, True)):
        before = encode_state(live.scheduler.state)
        with capture_logs() as restart_logs:
            live = await follow(Scheduler(bus, CONFIG), use_snapshot)
            # The replay skips the entry again, to the same state; it is not dead-lettered nor logged again.
            assert encode_state(live.scheduler.state) == before
            await admin.append(ev.JobSubmitted(job_id=job_id, user="alice", spec=SPEC))
            await live.started(admin, job_id)
            await live.settled(admin)
            await live.close()
        assert poison_logs(restart_logs) == []
    assert len(await dead_letters(admin)) == 1


async def follow(scheduler: Scheduler, use_snapshot: bool) -> Running:
    """Rebuild ``scheduler``'s state, then have it follow the log."""
    await scheduler.rebuild(use_snapshot=use_snapshot)
    return Running(scheduler)
