"""The scheduler process: rebuild, then follow the log; while it holds the lease, decide and answer queries.

Every scheduler process runs the same loops (``Scheduler.follow`` and ``ticker``, ``Leadership.run``); the
one holding the lease decides (``Scheduler.leading``), the others stay warm. The query verbs are served by
the leader only (a standby makes no plan, so it has no pending reasons to show), ``ping`` by every one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from corral.libs.core import lease as lease_rules
from corral.libs.runtime.api_server import serve
from corral.libs.runtime.service import Context, either, run_until_stopped
from corral.schemas import api
from corral.services.scheduler.app import Scheduler
from corral.services.scheduler.leadership import Leadership
from corral.services.scheduler.metrics import SchedulerMetrics


async def main(ctx: Context) -> None:
    """Rebuild, then follow the log; while holding the lease, decide and answer queries."""
    metrics = SchedulerMetrics(ctx.metrics.registry) if ctx.metrics is not None else None
    ttl = ctx.config.scheduler.lease_ttl_s
    scheduler = Scheduler(ctx.bus, ctx.config, metrics=metrics)
    scheduler.leader = Leadership(ctx.bus.js, ctx.args.name, ttl, lambda: scheduler.state.epoch)
    await scheduler.rebuild()
    ping = await serve(ctx.nc, "ping", api.PingRequest, scheduler.ping, queue="scheduler")
    try:
        await run_until_stopped(
            ctx.stop,
            scheduler.follow(ctx.stop),
            scheduler.ticker(ctx.stop),
            scheduler.leader.run(ctx.stop),
            serve_while_leading(ctx, scheduler),
        )
    finally:
        await ping.unsubscribe()


async def serve_while_leading(ctx: Context, scheduler: Scheduler) -> None:
    """The leader answers the queries (a standby's plan is not made: it has no pending reasons to show); a
    new leader plans at once, without waiting for the next event or full pass."""
    assert scheduler.leader is not None
    answers: dict[str, tuple[Any, Any]] = {
        "jobs": (api.JobsRequest, scheduler.jobs),
        "nodes": (api.NodesRequest, scheduler.nodes),
        "will_run": (api.WillRunRequest, scheduler.will_run),
        "priority": (api.PriorityRequest, scheduler.priority),
        "shares": (api.SharesRequest, scheduler.shares),
        "reservations": (api.ReservationsRequest, scheduler.reservations),
    }
    while not ctx.stop.is_set():
        await either(ctx.stop, scheduler.leader.gained)
        if ctx.stop.is_set():
            return
        subs = [
            await serve(ctx.nc, verb, kind, handler, queue="scheduler")
            for verb, (kind, handler) in answers.items()
        ]
        try:
            await scheduler.cycle()
            while scheduler.leader.gained.is_set() and not ctx.stop.is_set():
                await asyncio.sleep(lease_rules.poll_s(scheduler.leader.ttl_s))
        finally:
            for sub in subs:
                await sub.unsubscribe()
