"""Health (slurmctld's node monitor): heartbeats and admin intents in, node facts out.

Cycle:
1. follow the node events of the log to know which nodes are registered, which are down (and which of
   those an admin downed), and which admin requests (``NodeDrainRequested``/``NodeDownRequested``/
   ``NodeResumeRequested``, from the gateway) are not answered yet;
2. once caught up with the log, answer each such request with ``NodeDrained``/``NodeDown(by=admin)``/
   ``NodeResumed`` (tried again whenever it is caught up again and every half timeout, until an answer
   lands);
3. note the time of each node's latest heartbeat (``corral.hb.<node>``);
4. every half timeout: a node that is up and silent for ``node_timeout`` becomes ``NodeDown``;
   a down node that heartbeats again becomes ``NodeUp`` — unless an admin downed it: only a resume
   brings that one back. Silence is counted only while health listens (``libs/core/liveness.py``):
   while its NATS connection is down it concludes nothing, and once it is back every node gets a fresh
   ``node_timeout`` (``connected``, which ``main`` hands to the connection's ``Link``);
5. health reports (``corral.ext.health.<reporter>.<node>``) become drains (``reports.py``).

An answer names the request it answers as its cause (``Meta.causation_id``); a ``NodeDown`` for missed
heartbeats and a ``NodeUp`` have no cause in the log (the reason is in the body).

Every append is conditional on the node's last event sequence (of any entry on its subjects, a malformed one
included, so that no entry can stall a node), so several health replicas never report
the same change twice, and an answer computed from a stale view of the node is refused and tried again.

``Health`` takes its log and its clock as ports (``libs/runtime/ports.py``): ``main`` gives it the bus and
the system clock, the unit tests an in-memory log and a fake clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.aio.client import Client
from nats.aio.msg import Msg

from corral.libs.config.cluster import ClusterConfig
from corral.libs.core.liveness import Verdict, verdict
from corral.libs.runtime import nats_link, telemetry
from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.errors import AppendConflict, TransientError
from corral.libs.runtime.ports import Clock, EventLog
from corral.libs.runtime.service import Context, run_until_stopped
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.health.reports import HealthReports

#: A round trip to NATS slower than this (seconds) means the server was stalled (``Health.listening``).
SLOW_S = 0.5

AdminRequest = ev.NodeDrainRequested | ev.NodeResumeRequested | ev.NodeDownRequested


class Health:
    """Node liveness from heartbeats."""

    def __init__(
        self,
        events: EventLog,
        config: ClusterConfig,
        clock: Clock,
        probe: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.events = events
        self.probe = probe or _always  # a round trip to NATS: does health still hear?
        self.clock = clock
        self.timeout = config.node_timeout_s
        self.up: dict[str, bool] = {}  # registered nodes: up?
        self.node_seq: dict[str, int] = {}  # last log sequence of each node's events
        self.seen: dict[
            str, float
        ] = {}  # monotonic time of the latest sign of life (heartbeat, registration)
        self.heard: dict[str, float] = {}  # monotonic time of the latest heartbeat
        self.requests: dict[str, AdminRequest] = {}  # unanswered admin request of each node, the newest
        self.request_ids: dict[str, str] = {}  # the event id of each of those requests (their answer's cause)
        self.admin_down: set[str] = set()  # nodes an admin downed (not brought up by heartbeats)
        self.drained: dict[str, str] = {}  # drained nodes' reasons (a health report's repeat drains nothing)
        self.wake = asyncio.Event()  # set when there are requests to answer and the log is read to its end
        # When the current listening window opened (start, reconnection); None while disconnected.
        self.window: float | None = clock.monotonic()
        self.paused = False  # the window was closed by a failed round trip (not by a disconnection)
        self.log = telemetry.logger()

    async def follow(self, stop: asyncio.Event) -> None:
        """Keep ``up`` in step with the log's node events."""
        async for entry in self.events.read(1, subject="corral.evt.node.>", follow=True):
            body = entry.envelope.body if entry.envelope else None
            if isinstance(body, ev.NodeRegistered | ev.NodeUp):
                # The fold keeps an admin's down through registrations (and heartbeats): so does health.
                self.up[body.node] = body.node not in self.admin_down
                self.seen.setdefault(body.node, self.clock.monotonic())
            elif isinstance(body, ev.NodeDown):
                self.up[body.node] = False
                if body.by:
                    self.admin_down.add(body.node)
                    self.requests.pop(body.node, None)
                else:
                    self.admin_down.discard(body.node)
            elif isinstance(body, ev.NodeDrainRequested | ev.NodeResumeRequested | ev.NodeDownRequested):
                self.requests[body.node] = body  # a newer request replaces an unanswered one
                assert entry.envelope is not None
                self.request_ids[body.node] = entry.envelope.meta.event_id
            elif isinstance(body, ev.NodeDrained | ev.NodeResumed):
                self.requests.pop(body.node, None)
                if isinstance(body, ev.NodeDrained):
                    self.drained[body.node] = body.reason
                else:
                    self.drained.pop(body.node, None)
                if isinstance(body, ev.NodeResumed) and body.node in self.admin_down:
                    # Up again; the next check reports it down if it does not heartbeat.
                    self.admin_down.discard(body.node)
                    self.up[body.node] = True
            owner = subjects.entry_owner(entry.subject)
            if owner is not None and owner[0] == "node":
                # Every entry on the node's subjects moves the sequence appends are conditional on, one that
                # fails to decode or claims another node included (the fold's rule: ``fold.skip``).
                self.node_seq[owner[1]] = entry.seq
            if entry.pending == 0 and self.requests:
                # Caught up: what is still unanswered is (replaying, an answer would only lose its race).
                self.wake.set()
            if stop.is_set():
                return

    async def answer_requests(self, stop: asyncio.Event) -> None:
        """Answer the unanswered admin requests whenever ``follow`` is caught up, and every half timeout.

        A task of its own, so that reading the log never waits for an append's acknowledgement.
        """
        while not stop.is_set():
            await self.clock.sleep(max(self.timeout / 2, 0.2), self.wake)
            self.wake.clear()
            for node in list(self.requests):
                await self.answer(node)

    async def answer(self, node: str) -> None:
        """Append the fact that answers the node's unanswered admin request, if it has one."""
        request, cause = self.requests.get(node), self.request_ids.get(node)
        if isinstance(request, ev.NodeDrainRequested):
            await self._report(
                ev.NodeDrained(node=request.node, reason=request.reason, by=request.user), cause
            )
        elif isinstance(request, ev.NodeResumeRequested):
            await self._report(ev.NodeResumed(node=request.node, by=request.user), cause)
        elif isinstance(request, ev.NodeDownRequested):
            await self._report(ev.NodeDown(node=request.node, reason=request.reason, by=request.user), cause)

    def heartbeat(self, node: str) -> None:
        """Note a heartbeat of ``node``."""
        self.seen[node] = self.heard[node] = self.clock.monotonic()

    def connected(self, connected: bool) -> None:
        """Health's own NATS connection dropped (False) or is back (True): close the listening window, or
        open a new one, in which every node has a fresh ``node_timeout`` to be heard."""
        self.window = self.clock.monotonic() if connected else None
        self.paused = False  # the connection's own events take over from the round trips
        self.log.info("listening window", open=connected)

    async def check(self) -> None:
        """Report nodes whose liveness changed; before calling any node silent, make sure health itself
        still hears (``listening``), then look again with what arrived meanwhile."""
        if self.window is None and self.paused and await self.probe():
            self.window, self.paused = self.clock.monotonic(), False  # back: a fresh window
            self.log.info("listening window", open=True, reason="NATS answers again")
        changes = self._changes()
        if any(change == "down" for _, change in changes):
            if not await self.listening():
                return
            changes = self._changes()  # heartbeats the server passed on before its answer count
        for node, change in changes:
            if change == "down":
                await self._report(ev.NodeDown(node=ev.NodeName(node), reason="Not responding"))
            else:
                await self._report(ev.NodeUp(node=ev.NodeName(node)))

    def _changes(self) -> list[tuple[str, Verdict]]:
        """The nodes whose liveness changed, by the rule (``libs/core/liveness.py``), now."""
        now = self.clock.monotonic()
        return [
            (node, change)
            for node, up in list(self.up.items())
            if node not in self.admin_down  # down until an admin resumes it
            and (
                change := verdict(
                    up=up,
                    sign=self.seen.get(node),
                    heartbeat=self.heard.get(node),
                    window=self.window,
                    now=now,
                    timeout=self.timeout,
                )
            )
        ]

    async def listening(self) -> bool:
        """Whether the server answers two round trips in a row, promptly.

        A server that is paused (SIGSTOP) or cut off keeps the socket open, so the client notices nothing
        for a while: an unanswered round trip closes the listening window, and the first check whose
        round trip is answered opens a new one. A server that answers but only after ``SLOW_S`` seconds
        was stalled, and heartbeats were held up with it: the window opens afresh at its answer. The
        second round trip is sent after the first is answered, once the server runs again: the heartbeats
        it held are on their way to health before its answer."""
        started = self.clock.monotonic()
        if not (await self.probe() and await self.probe()):
            if self.window is not None:
                self.window, self.paused = None, True
                self.log.warning("listening window", open=False, reason="no answer from NATS")
            return False
        if self.clock.monotonic() - started > SLOW_S:
            self.window = self.clock.monotonic()
            self.log.warning("listening window", open=True, reason="NATS was slow to answer")
            return False
        return True

    async def _report(
        self, body: ev.NodeDown | ev.NodeUp | ev.NodeDrained | ev.NodeResumed, cause: str | None = None
    ) -> None:
        try:
            await self.events.append(
                body,
                expect_last_seq=self.node_seq.get(body.node, 0),
                expect_subject=f"corral.evt.node.{body.node}.>",
                causation_id=cause,
            )
            # Not ``event=``: structlog's message is its ``event`` argument (a TypeError that ended the task).
            self.log.info("node state change", node=body.node, fact=type(body).__name__)
        except AppendConflict:
            pass  # someone else reported it, or the node re-registered: the log will tell us
        except TransientError as exc:
            self.log.warning("cannot report node state", node=body.node, error=str(exc))

    async def monitor(self, stop: asyncio.Event) -> None:
        """Check every half timeout."""
        while not stop.is_set():
            await self.clock.sleep(max(self.timeout / 2, 0.2), stop)
            await self.check()


async def _always() -> bool:
    return True


#: The service name of health's dead letters (``corral.dlq.health``) and of its report queue group.
SERVICE = "health"


#: Seconds a round trip to NATS may take before health counts itself as not hearing.
PROBE_TIMEOUT_S = 1  # an int: nats-py types flush's timeout so


def round_trip(nc: Client) -> Callable[[], Awaitable[bool]]:
    """A PING/PONG with the server: True if it answered within ``PROBE_TIMEOUT_S``."""
    return lambda: nats_link.flush(nc, PROBE_TIMEOUT_S)


async def main(ctx: Context) -> None:
    """Run until stopped."""
    health = Health(ctx.bus, ctx.config, SystemClock(), probe=round_trip(ctx.nc))
    if ctx.link is not None:
        ctx.link.watch(health.connected)

    async def on_heartbeat(msg: Msg) -> None:
        health.heartbeat(msg.subject.rsplit(".", 1)[-1])

    reports = HealthReports(ctx.bus, ctx.config, health.node_seq, health.drained)

    async def on_report(msg: Msg) -> None:
        refused = await reports.handle(msg.subject, msg.data)
        if refused is not None:
            await ctx.bus.dead_letter(SERVICE, msg, refused)

    sub = await ctx.nc.subscribe(subjects.heartbeat_subject("*"), cb=on_heartbeat)
    # A queue group: one health replica takes each report (each would append the same drain).
    report_sub = await ctx.nc.subscribe(subjects.HEALTH_REPORTS, queue=SERVICE, cb=on_report)
    try:
        await run_until_stopped(
            ctx.stop, health.follow(ctx.stop), health.answer_requests(ctx.stop), health.monitor(ctx.stop)
        )
    finally:
        await sub.unsubscribe()
        await report_sub.unsubscribe()
