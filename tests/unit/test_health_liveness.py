"""Health's node monitor on an in-memory log and a fake clock: liveness from heartbeats, and admin requests.

The three loops of ``Health`` (follow, answer_requests, monitor) run as they do in the service; the fake
clock moves only when a test advances it, and ``clock.asleep(n)`` returns once ``n`` loops sleep on it
again, i.e. once they have done their step. The node timeout is the builders' 10 s (checks every 5 s).
"""

from __future__ import annotations

import asyncio

import pytest

from corral.libs.runtime.clock import FakeClock
from corral.libs.runtime.memlog import MemLog
from corral.libs.runtime.service import run_until_stopped
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.health.app import Health
from tests.unit import rigs
from tests.unit.builders import cluster_config, registered
from tests.unit.rigs import HEALTH_SLEEPERS, running

# A fake clock nobody advances would hang a test that waits on it: fail it fast instead.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

NODE = ev.NodeName("gpu01")


async def step(clock: FakeClock, seconds: float, replicas: int = 1) -> None:
    """Advance the clock and wait until every loop has done what it does then and sleeps again."""
    await rigs.step(clock, seconds, HEALTH_SLEEPERS * replicas)


def node_facts(log: MemLog) -> list[ev.Event | None]:
    """What health appended about the node (its liveness and its answers)."""
    return [
        b
        for b in log.bodies(f"corral.evt.node.{NODE}.>")
        if isinstance(b, ev.NodeDown | ev.NodeUp | ev.NodeDrained | ev.NodeResumed)
    ]


async def first_after(log: MemLog, seq: int, tag: str) -> ev.Event:
    """The first entry on the node's ``tag`` subject after ``seq`` (waits for it: 2 s real time at most)."""
    async with asyncio.timeout(2.0):
        async for entry in log.read(seq + 1, subject=subjects.node_subject(NODE, tag), follow=True):
            assert entry.envelope is not None
            return entry.envelope.body
    raise AssertionError("the log ended")


async def test_a_node_silent_for_node_timeout_is_down_and_a_heartbeat_brings_it_up() -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    async with running(log, clock) as [health]:
        await step(clock, 5.0)
        await step(clock, 5.0)  # silent exactly node_timeout: not yet
        assert node_facts(log) == []
        await step(clock, 5.0)
        assert node_facts(log) == [ev.NodeDown(node=NODE, reason="Not responding")]
        # Missed heartbeats are not in the log: the reason says it, and nothing is named as the cause.
        down = await log.last_entry(subjects.node_subject(NODE, "node_down"))
        assert down is not None and down.envelope is not None and down.envelope.meta.causation_id is None
        await step(clock, 5.0)  # still silent: reported once
        assert len(node_facts(log)) == 1
        health.heartbeat(NODE)
        await step(clock, 5.0)
        assert node_facts(log)[1:] == [ev.NodeUp(node=NODE)]


@pytest.mark.parametrize(
    "data",
    [b"{}", b"\x00not json", b'{"meta": {}, "body": {"type": "node_up", "node": "gpu02"}}'],
    ids=["empty", "not json", "incomplete envelope"],
)
async def test_an_entry_without_an_event_on_a_nodes_subjects_does_not_stall_it(data: bytes) -> None:
    """Health's appends are conditional on the node's newest sequence: a malformed entry there (once, the
    reply of a confused deputy) counts too, or the silent node could never be reported down."""
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    log.put(subjects.node_subject(NODE, "node_down"), data)
    async with running(log, clock):
        for _ in range(3):
            await step(clock, 5.0)
        assert node_facts(log) == [ev.NodeDown(node=NODE, reason="Not responding")]


async def test_heartbeats_keep_a_node_up() -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    async with running(log, clock) as [health]:
        for _ in range(6):
            health.heartbeat(NODE)
            await step(clock, 5.0)
    assert node_facts(log) == []


async def test_an_admin_downed_node_stays_down_through_heartbeats_until_resumed() -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    await log.append(ev.NodeDown(node=NODE, reason="maintenance", by="root"))
    async with running(log, clock) as [health]:
        for _ in range(3):
            health.heartbeat(NODE)
            await step(clock, 5.0)
        assert len(node_facts(log)) == 1  # the admin's down only: no NodeUp
        await log.append(ev.NodeResumed(node=NODE, by="root"))
        health.heartbeat(NODE)
        await step(clock, 5.0)
        assert node_facts(log)[1:] == [ev.NodeResumed(node=NODE, by="root")]  # up, heartbeating
        await step(clock, 5.0)
        await step(clock, 5.0)  # silent since the resume: down again, as not responding
        assert node_facts(log)[2:] == [ev.NodeDown(node=NODE, reason="Not responding")]


async def test_two_replicas_report_a_silent_node_once() -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    async with running(log, clock, replicas=2):
        for _ in range(4):
            await step(clock, 5.0, replicas=2)
    # Both saw the silence; the second's append expected the node's old last sequence and lost.
    assert node_facts(log) == [ev.NodeDown(node=NODE, reason="Not responding")]


REQUESTS: list[tuple[ev.Event, str, ev.Event]] = [
    (
        ev.NodeDrainRequested(node=NODE, user="root", reason="bad fan"),
        "node_drained",
        ev.NodeDrained(node=NODE, reason="bad fan", by="root"),
    ),
    (
        ev.NodeDownRequested(node=NODE, user="root", reason="bad fan"),
        "node_down",
        ev.NodeDown(node=NODE, reason="bad fan", by="root"),
    ),
    (ev.NodeResumeRequested(node=NODE, user="root"), "node_resumed", ev.NodeResumed(node=NODE, by="root")),
]


@pytest.mark.parametrize(("request_", "tag", "answer"), REQUESTS, ids=["drain", "down", "resume"])
async def test_an_admin_request_is_answered_with_its_fact(
    request_: ev.Event, tag: str, answer: ev.Event
) -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    asked = await log.append(request_)
    async with running(log, clock):
        assert await first_after(log, asked.seq, tag) == answer
        await step(clock, 5.0)  # answered once: the answer ends the request
        assert node_facts(log) == [answer]
    # The answer names the request as its cause (Meta.causation_id).
    answered = await log.last_entry(subjects.node_subject(NODE, tag))
    assert answered is not None and answered.envelope is not None
    assert answered.envelope.meta.causation_id == asked.envelope.meta.event_id


async def test_a_newer_request_replaces_an_unanswered_one() -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    await log.append(ev.NodeDrainRequested(node=NODE, user="root", reason="bad fan"))
    resume = await log.append(ev.NodeResumeRequested(node=NODE, user="ops"))
    async with running(log, clock):
        assert await first_after(log, resume.seq, "node_resumed") == ev.NodeResumed(node=NODE, by="ops")
        await step(clock, 5.0)
    assert node_facts(log) == [ev.NodeResumed(node=NODE, by="ops")]


async def test_silence_while_health_is_disconnected_is_not_node_silence() -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    async with running(log, clock) as [health]:
        health.heartbeat(NODE)
        await step(clock, 5.0)
        health.connected(False)  # health's own connection drops: it hears nothing for 30 s
        for _ in range(6):
            await step(clock, 5.0)
        assert node_facts(log) == []
        health.connected(True)  # back at t=35: the node has a fresh 10 s from here
        await step(clock, 5.0)
        await step(clock, 5.0)  # silent exactly node_timeout since the reconnection: not yet
        assert node_facts(log) == []
        await step(clock, 5.0)  # and still silent: now it is down
        assert node_facts(log) == [ev.NodeDown(node=NODE, reason="Not responding")]


async def test_a_reconnection_brings_no_down_node_up_without_a_heartbeat() -> None:
    log, clock = MemLog(), FakeClock()
    await log.append(registered(NODE))
    await log.append(ev.NodeDown(node=NODE, reason="Not responding"))
    async with running(log, clock) as [health]:
        health.connected(False)
        await step(clock, 5.0)
        health.connected(True)
        await step(clock, 5.0)
        await step(clock, 5.0)
        assert node_facts(log) == [ev.NodeDown(node=NODE, reason="Not responding")]
        health.heartbeat(NODE)
        await step(clock, 5.0)
        assert node_facts(log)[1:] == [ev.NodeUp(node=NODE)]


class Server:
    """Health's round trip to NATS: answers unless ``paused`` (a SIGSTOPped server keeps the socket),
    after ``lag`` seconds of the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.paused = False
        self.lag = 0.0

    async def probe(self) -> bool:
        self.clock.advance(self.lag)
        return not self.paused


def monitored(
    log: MemLog, clock: FakeClock, server: Server
) -> tuple[Health, asyncio.Event, asyncio.Task[None]]:
    """A health service whose round trips go to ``server``: its follow and monitor loops, started."""
    health = Health(log, cluster_config(nodes=2), clock, probe=server.probe)
    stop = asyncio.Event()
    return (
        health,
        stop,
        asyncio.create_task(run_until_stopped(stop, health.follow(stop), health.monitor(stop))),
    )


async def test_no_node_is_called_down_while_the_server_does_not_answer_a_round_trip() -> None:
    log = MemLog()
    clock = FakeClock()
    server = Server(clock)
    await log.append(registered(NODE))
    _, stop, task = monitored(log, clock, server)
    await clock.asleep(1)
    try:
        server.paused = True  # no heartbeat reaches health, and its round trips go unanswered
        for _ in range(6):
            await rigs.step(clock, 5.0, 1)
        assert node_facts(log) == []
        server.paused = False  # at t=30: the next check (t=35) opens a fresh window
        for _ in range(3):
            await rigs.step(clock, 5.0, 1)
        assert node_facts(log) == []  # t=45: silent exactly 10 s in the new window
        await rigs.step(clock, 5.0, 1)
        assert node_facts(log) == [ev.NodeDown(node=NODE, reason="Not responding")]
    finally:
        stop.set()
        await task


async def test_a_round_trip_answered_late_restarts_the_window_at_the_answer() -> None:
    log = MemLog()
    clock = FakeClock()
    server = Server(clock)
    await log.append(registered(NODE))
    _, stop, task = monitored(log, clock, server)
    await clock.asleep(1)
    try:
        server.lag = 0.4  # two round trips of 0.4 s: the server was stalled until its answer (t=15.8)
        for _ in range(3):
            await rigs.step(clock, 5.0, 1)
        assert node_facts(log) == []
        server.lag = 0.0
        await rigs.step(clock, 5.0, 1)  # t=20.8: 5 s into the new window
        await rigs.step(clock, 5.0, 1)  # t=25.8: silent exactly 10 s
        assert node_facts(log) == []
        await rigs.step(clock, 5.0, 1)
        assert node_facts(log) == [ev.NodeDown(node=NODE, reason="Not responding")]
    finally:
        stop.set()
        await task
