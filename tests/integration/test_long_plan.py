"""A plan that takes longer than the leader lease (a deep queue, conservative backfill on a big cluster: one
pass on 3,000 nodes and 30,000 pending jobs takes ~20 s here, bench/RESULTS.md) still decides: the leader
keeps renewing its lease while it plans, and its decisions go out (a real nats-server, the scheduler's
role, the scheduler's loops as ``process.py`` runs them).

Before, the plan held the event loop: the lease lapsed by the leader's own clock while it planned, every
decision was refused ("not the leader any more"), the lease was renewed (nobody had taken it) and the next
cycle planned as long again: nothing was ever decided."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Callable
from typing import Any

import pytest
from test_rebuild_paths import buses, server
from test_scheduler_cycle import CONFIG, registered, spec

from corral.libs.runtime.bus import Bus
from corral.schemas import events as ev
from corral.services.scheduler import app
from corral.services.scheduler.app import Scheduler
from corral.services.scheduler.leadership import Leadership
from corral.services.scheduler.process import plan_on_takeover

pytestmark = pytest.mark.integration

# the fixtures this module uses from test_rebuild_paths: fresh streams, the scheduler's bus and the admin's
__all__ = ["buses", "server"]

#: The lease (the shortest the configuration allows) and how much longer than it a plan takes.
TTL_S = 0.5
PLAN_S = 4 * TTL_S


def slower(plan: Callable[..., Any], planning: list[float]) -> Callable[..., Any]:
    """The real plan, after ``PLAN_S`` seconds of Python on the CPU (holding the interpreter as a long plan's
    own work does)."""

    def slow(*args: Any, **kwargs: Any) -> Any:
        began = time.monotonic()
        while time.monotonic() - began < PLAN_S:
            pass
        planning.append(time.monotonic() - began)
        return plan(*args, **kwargs)

    return slow


async def test_a_plan_longer_than_the_lease_decides_and_the_leader_keeps_its_lease(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await registered(admin)
    for job_id in (1, 2, 3):
        await admin.append(ev.JobSubmitted(job_id=job_id, user="alice", spec=spec(f"j{job_id}")))
    planning: list[float] = []
    monkeypatch.setattr(app, "plan_paused", slower(app.plan_paused, planning))
    live = Scheduler(bus, CONFIG)
    live.leader = Leadership(bus.js, "long-planner", TTL_S, lambda: live.state.epoch)
    await live.rebuild()
    stop = asyncio.Event()
    loops = [
        asyncio.create_task(live.follow(stop)),
        asyncio.create_task(live.ticker(stop)),
        asyncio.create_task(live.leader.run(stop)),
        asyncio.create_task(plan_on_takeover(types.SimpleNamespace(stop=stop), live)),  # type: ignore[arg-type]
    ]
    epochs: set[int] = set()
    try:
        deadline = time.monotonic() + 8 * PLAN_S
        while time.monotonic() < deadline:
            if live.leader.epoch:  # (0: before it first took the lease)
                epochs.add(live.leader.epoch)
            if all(live.state.jobs[j].state == "RUNNING" for j in (1, 2, 3)):
                break
            await asyncio.sleep(0.05)
        states = {j: live.state.jobs[j].state for j in (1, 2, 3)}
        assert states == {1: "RUNNING", 2: "RUNNING", 3: "RUNNING"}, (states, planning)
        # One leader throughout: its lease never lapsed (a lapse is a takeover with the next epoch).
        assert epochs == {1}, epochs
        assert planning and min(planning) >= PLAN_S
    finally:
        stop.set()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
