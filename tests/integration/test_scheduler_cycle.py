"""A scheduling cycle's sends (a real nats-server, the scheduler's role): the orders of what the log already
says go out before the cycle plans, a cycle's decisions go out together, pipelined on one connection in their
order, not one round trip after another, and a cycle after entries that cannot change a plan (its own
decisions coming back, runs starting) only sends orders."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from test_rebuild_paths import buses, server

from corral.libs.config.cluster import parse_config
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import AppendConflict, TransientError
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.scheduler import app, sending
from corral.services.scheduler.app import Scheduler

pytestmark = pytest.mark.integration

# the fixtures this module uses from test_rebuild_paths: fresh streams, the scheduler's bus and the admin's
__all__ = ["buses", "server"]

CONFIG = parse_config("""
[[nodes]]
names = "cy[1-3]"
cpus = 16
memory = "64G"
gpus = 4

[[partitions]]
name = "batch"
nodes = "cy[1-3]"
default = true
""")


def spec(name: str) -> ev.JobSpec:
    return ev.JobSpec(
        name=name,
        script="#!/bin/sh\ntrue\n",
        workdir="/tmp",
        gpus_per_node=1,
        time_limit_s=600,
        partition="batch",
    )


async def registered(admin: Bus) -> None:
    """The three nodes, as their agents register them."""
    for i in (1, 2, 3):
        await admin.append(
            ev.NodeRegistered(node=f"cy{i}", cpus=16, mem_mb=65536, gpus=4, partitions=["batch"])
        )


def in_flight(bus: Bus) -> list[int]:
    """Records, at each publish the scheduler's connection makes, how many of its appends and orders are
    waiting for their acknowledgement (that one included)."""
    seen: list[int] = []
    publish = bus.nc.publish

    async def counting(*args: Any, **kwargs: Any) -> None:
        seen.append(len(bus.pipeline._waiting))
        await publish(*args, **kwargs)

    bus.nc.publish = counting  # type: ignore[method-assign]
    return seen


async def test_a_cycles_decisions_go_out_together_and_their_orders_without_a_plan(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await registered(admin)
    for job_id in range(1, 13):  # twelve one-GPU jobs: the three nodes take them all at once
        await admin.append(ev.JobSubmitted(job_id=job_id, user="alice", spec=spec(f"j{job_id}")))
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    seen = in_flight(bus)
    await live.cycle()
    # Twelve allocations in flight at once: one write, one round trip (sent one by one, each would be alone).
    assert max(seen) == 12, seen
    # Once they came back, the next cycle puts their launch orders on the work stream, and does not plan:
    # the plan that made them counted them already.
    sent_when_planning: list[int] = []
    plan = app.plan_paused

    def planning(*args: Any, **kwargs: Any) -> Any:
        sent_when_planning.append(len(live.sent))
        return plan(*args, **kwargs)

    monkeypatch.setattr(app, "plan_paused", planning)
    await fold_new(live, bus)
    assert sum(job.state == "RUNNING" for job in live.state.jobs.values()) == 12
    seen.clear()
    await live.cycle()
    assert sent_when_planning == [] and len(live.sent) == 12
    assert max(seen) == 12, seen  # the twelve orders: together too
    info = await admin.js.stream_info(subjects.WORK_STREAM)
    assert info.state.messages == 12
    # The runs starting ask for no plan either; a submission does, and a full pass always plans.
    for job_id in range(1, 13):
        await admin.append(
            ev.RunStarted(job_id=job_id, attempt=0, node=live.state.jobs[job_id].allocations[0].node, pid=1)
        )
    await fold_new(live, bus)
    await live.cycle()
    assert sent_when_planning == []
    await live.cycle(full=True)
    assert sent_when_planning == [0]  # (the launch orders are no longer needed: their ids forgotten)
    await admin.append(ev.JobSubmitted(job_id=13, user="alice", spec=spec("j13")))
    await fold_new(live, bus)
    await live.cycle()
    assert sent_when_planning == [0, 0]
    assert live.state.jobs[13].state == "PENDING"  # (its allocation is on its way back)


async def fold_new(live: Scheduler, bus: Bus) -> None:
    """Fold what the log has that the scheduler has not folded yet."""
    async for entry in bus.read(live.state.last_seq + 1):
        live.apply(entry)


async def one_job(bus: Bus, admin: Bus) -> Scheduler:
    """A scheduler rebuilt from a log of the three nodes and job 1, pending."""
    await registered(admin)
    await admin.append(ev.JobSubmitted(job_id=1, user="alice", spec=spec("j1")))
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    return live


async def test_of_two_decisions_on_one_job_sent_together_the_first_wins(buses: tuple[Bus, Bus]) -> None:
    bus, admin = buses
    live = await one_job(bus, admin)
    first = ev.JobReasonChanged(job_id=1, attempt=0, reason="Priority", epoch=live.epoch)
    second = ev.JobReasonChanged(job_id=1, attempt=0, reason="Resources", epoch=live.epoch)
    await sending.every(
        live.publish(decision) for decision in (first, second)
    )  # the second: superseded, logged
    await fold_new(live, bus)
    logged = live.state.jobs[1].logged_reason
    assert logged is not None and logged.reason == "Priority"
    # And a failure among sends is raised once they all ended.
    with pytest.raises(AppendConflict):
        await sending.every([asyncio.sleep(0), _conflict()])


async def _conflict() -> None:
    raise AppendConflict("subject", 1)


async def test_a_job_waiting_on_another_is_planned_when_that_ones_end_comes_back(
    buses: tuple[Bus, Bus],
) -> None:
    # Dependencies are judged from the folded state, not from the plan's own ends: the conclusion coming
    # back must be planned after, not left to the next full pass.
    bus, admin = buses
    await registered(admin)
    waits = ev.Dependencies(items=[ev.Dependency(type="afterok", job_id=1)])
    await admin.append(ev.JobSubmitted(job_id=1, user="alice", spec=spec("j1")))
    await admin.append(
        ev.JobSubmitted(job_id=2, user="alice", spec=msgspec.structs.replace(spec("j2"), dependencies=waits))
    )
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    await live.cycle()
    await fold_new(live, bus)
    assert (live.state.jobs[1].state, live.state.jobs[2].state) == ("RUNNING", "PENDING")
    node = live.state.jobs[1].allocations[0].node
    await admin.append(ev.RunStarted(job_id=1, attempt=0, node=node, pid=1))
    await admin.append(ev.RunExited(job_id=1, attempt=0, node=node, exit_code=0))
    await fold_new(live, bus)
    await live.cycle()  # concludes job 1
    await fold_new(live, bus)
    assert live.state.jobs[1].state == "COMPLETED"
    await live.cycle()  # its end came back: job 2 may start
    await fold_new(live, bus)
    assert live.state.jobs[2].state == "RUNNING"


async def test_orders_that_cannot_go_hold_back_no_plan(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    live = await one_job(bus, admin)
    await live.cycle()
    await fold_new(live, bus)

    async def unreadable(job_id: int) -> ev.JobSpec:
        raise TransientError("the log is away")

    monkeypatch.setattr(live, "full_spec", unreadable)
    await admin.append(ev.JobSubmitted(job_id=2, user="alice", spec=spec("j2")))
    await fold_new(live, bus)
    await live.cycle()  # job 1's launch order cannot go: job 2 is planned all the same
    await fold_new(live, bus)
    assert live.state.jobs[2].state == "RUNNING" and live.sent == set()


async def test_a_full_pass_that_finds_a_cycle_running_is_the_next_cycles(buses: tuple[Bus, Bus]) -> None:
    bus, admin = buses
    await registered(admin)
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    await live.cycle()
    assert not live.replan
    async with live.lock:
        await live.cycle(full=True)  # finds the lock held: returns at once
    assert live.replan  # the next cycle plans


async def test_a_full_pass_from_a_state_behind_the_log_sends_no_order(buses: tuple[Bus, Bus]) -> None:
    # A leader whose reading stalled: job 1's run started and ended in the log meanwhile. Its launch order,
    # sent now, would start the job again on an agent that no longer remembers the run (agent/records.py).
    bus, admin = buses
    live = await one_job(bus, admin)
    await live.cycle()
    await fold_new(live, bus)
    node = live.state.jobs[1].allocations[0].node
    await admin.append(ev.RunStarted(job_id=1, attempt=0, node=node, pid=1))
    await admin.append(ev.RunExited(job_id=1, attempt=0, node=node, exit_code=0))
    live.order_lag_s = 0.0  # (the log's newest entry is a few ms ahead of the state here, not a minute)
    await live.cycle(full=True)
    info = await admin.js.stream_info(subjects.WORK_STREAM)
    assert (info.state.messages, live.sent) == (0, set())
    # Once it has read the log, the full pass goes on as ever: the run's end concludes the job, and the
    # next job is started; the ended run's order never went.
    await fold_new(live, bus)
    await admin.append(ev.JobSubmitted(job_id=2, user="alice", spec=spec("j2")))
    await fold_new(live, bus)
    await live.cycle(full=True)
    await fold_new(live, bus)
    assert (live.state.jobs[1].state, live.state.jobs[2].state) == ("COMPLETED", "RUNNING")
    info = await admin.js.stream_info(subjects.WORK_STREAM)
    assert info.state.messages == 0
