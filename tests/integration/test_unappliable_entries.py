"""Entries with no event for their subject never stall a job (a real nats-server, the real scheduler).

Agent node1 may publish ``corral.evt.job.*.run_started.node1`` for any job id, and a buggy writer may put
bytes that are no event on a job's subject. Before, the scheduler skipped such an entry without moving the
job's sequence, so every later decision for the job, conditional on the sequence it had
(``Nats-Expected-Last-Subject-Sequence``), lost its append: the job never started. Now the fold moves the
job's sequence past the entry (``fold.skip``) and the scheduler dead-letters it with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.js.errors import NotFoundError

from corral.libs.config.cluster import parse_config
from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.scheduler.app import DEAD_LETTERS, Scheduler

pytestmark = pytest.mark.integration

AGENT = roles.agent_role("node1")
PASSWORDS = {roles.ADMIN: "admin-secret", roles.SCHEDULER: "scheduler-secret", AGENT: "agent-secret"}
CONFIG = parse_config("""
[[nodes]]
names = "node[1-2]"
cpus = 8
memory = "16G"
gpus = 4
""")
SPEC = ev.JobSpec(name="j", script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=2, nodes=1)


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
    """Fresh streams; a bus of each role."""
    opened = {}
    for role, password in PASSWORDS.items():
        nc = await connect(Credentials(url=server.url, user=role, password=password), name=f"test-{role}")
        opened[role] = Bus(nc, actor=role)
    admin = opened[roles.ADMIN].js
    for stream in (subjects.EVENTS_STREAM, subjects.DLQ_STREAM, subjects.WORK_STREAM):
        with contextlib.suppress(NotFoundError):
            await admin.delete_stream(stream)
    await declare(admin)
    try:
        yield opened
    finally:
        for bus in opened.values():
            await bus.nc.close()


async def until(what: str, check: object) -> None:
    for _ in range(300):
        if callable(check) and check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def test_a_job_runs_after_entries_without_an_event_on_its_subjects(buses: dict[str, Bus]) -> None:
    admin, agent = buses[roles.ADMIN], buses[AGENT]
    scheduler = Scheduler(buses[roles.SCHEDULER], CONFIG)
    await scheduler.rebuild(use_snapshot=False)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.follow(stop))
    try:
        # Job 1 is pending (no node has registered yet), so the entries below come before its allocation.
        await admin.append(ev.JobSubmitted(job_id=1, user="alice", spec=SPEC))
        # The agent role may publish this subject for any job; ``{}`` is no event.
        forged = await agent.js.publish(subjects.job_subject(1, "run_started", "node1"), b"{}")
        malformed = await admin.js.publish(subjects.job_subject(1, "job_hold_requested"), b"\x00not json")
        for name in ("node1", "node2"):
            await admin.append(
                ev.NodeRegistered(node=name, cpus=8, mem_mb=16384, gpus=4, partitions=["batch"])
            )

        def allocated() -> bool:
            job = scheduler.state.jobs.get(1)
            return job is not None and job.state == "RUNNING"

        await until("job 1 allocated", allocated)
        node = scheduler.state.jobs[1].allocations[0].node
        run_agent = agent if node == "node1" else admin
        await run_agent.append(ev.RunStarted(job_id=1, attempt=0, node=node, pid=42))
        await until("job 1 started", lambda: scheduler.state.jobs[1].run_started)
        letters = await dead_letters(admin)
        assert {letter.headers["Corral-Seq"] for letter in letters} == {str(forged.seq), str(malformed.seq)}
        assert all("not a valid event" in letter.headers["Corral-Reason"] for letter in letters)
    finally:
        stop.set()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def dead_letters(bus: Bus) -> list:  # type: ignore[type-arg]
    """The scheduler's dead letters, oldest first."""
    info = await bus.js.stream_info(subjects.DLQ_STREAM)
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        with contextlib.suppress(NotFoundError):
            msg = await bus.js.get_msg(subjects.DLQ_STREAM, seq=seq)
            if msg.subject == subjects.dlq_subject(DEAD_LETTERS):
                found.append(msg)
    return found
