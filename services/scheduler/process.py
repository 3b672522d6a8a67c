"""The scheduler process: rebuild, then follow the log; while it holds the lease, decide; answer queries
always.

Every scheduler process runs the same loops (``Scheduler.follow`` and ``ticker``, ``Leadership.run``); the
one holding the lease decides (``Scheduler.leading``), the others stay warm. Every scheduler answers every
query verb and ``ping``, not as a queue group: each request reaches all of them and the caller takes the
first answer, so a dead, paused or partitioned scheduler delays no command (with a queue group, NATS would
hand some requests to a paused one, to wait for the caller's timeout). A standby answers from its own state
(the same log) and a plan of its own made for the answer (``Scheduler.view``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.libs.core import lease as lease_rules
from corral.libs.runtime.api_server import EVERY_SUBSCRIBER, serve
from corral.libs.runtime.service import Context, either, run_until_stopped
from corral.schemas import api
from corral.services.scheduler.app import Scheduler
from corral.services.scheduler.leadership import Leadership
from corral.services.scheduler.metrics import SchedulerMetrics


async def main(ctx: Context) -> None:
    """Rebuild, then follow the log and answer queries; while holding the lease, decide."""
    metrics = SchedulerMetrics(ctx.metrics.registry) if ctx.metrics is not None else None
    ttl = ctx.config.scheduler.lease_ttl_s
    scheduler = Scheduler(ctx.bus, ctx.config, metrics=metrics)
    scheduler.leader = Leadership(ctx.bus.js, ctx.args.name, ttl, lambda: scheduler.state.epoch)
    await scheduler.rebuild()
    answers: dict[str, tuple[Any, Any]] = {
        "ping": (api.PingRequest, scheduler.ping),
        "jobs": (api.JobsRequest, scheduler.jobs),
        "nodes": (api.NodesRequest, scheduler.nodes),
        "will_run": (api.WillRunRequest, scheduler.will_run),
        "priority": (api.PriorityRequest, scheduler.priority),
        "live_counts": (api.LiveCountsRequest, scheduler.live_counts),
        "shares": (api.SharesRequest, scheduler.shares),
        "reservations": (api.ReservationsRequest, scheduler.reservations),
    }
    subs = [
        await serve(ctx.nc, verb, kind, handler, queue=EVERY_SUBSCRIBER)
        for verb, (kind, handler) in answers.items()
    ]
    try:
        await run_until_stopped(
            ctx.stop,
            scheduler.follow(ctx.stop),
            scheduler.ticker(ctx.stop),
            scheduler.leader.run(ctx.stop),
            plan_on_takeover(ctx, scheduler),
        )
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def plan_on_takeover(ctx: Context, scheduler: Scheduler) -> None:
    """A new leader plans at once, without waiting for the next event or full pass."""
    assert scheduler.leader is not None
    while not ctx.stop.is_set():
        await either(ctx.stop, scheduler.leader.gained)
        if ctx.stop.is_set():
            return
        await scheduler.cycle(full=True)
        while scheduler.leader.gained.is_set() and not ctx.stop.is_set():
            await asyncio.sleep(lease_rules.poll_s(scheduler.leader.ttl_s))
