"""A standby scheduler answers the queries as the leader does: from its own fold of the same log and a plan
of its own made for the answer (it decides nothing), so no command waits for the leader."""

from __future__ import annotations

import asyncio
import math

import pytest
from test_scheduler_replay import settle

from corral.libs.config.cluster import parse_config
from corral.libs.runtime.bus import Bus
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.scheduler.app import Scheduler
from corral.services.scheduler.leadership import Leadership

pytestmark = pytest.mark.integration

# A partition of its own: the session's log holds other tests' jobs, which go to the default partition
# (on a node never registered here) and must not queue ahead.
CONFIG = """
[[nodes]]
names = "sq[1-2]"
cpus = 8
memory = "16G"
gpus = 4

[[partitions]]
name = "standby"
nodes = "sq1"

[[partitions]]
name = "others"
nodes = "sq2"
default = true
"""


def grid(t: float) -> float:
    """``t`` on the default backfill resolution's grid (60 s): the first multiple at or after it."""
    return math.ceil(t / 60) * 60.0


async def test_a_standby_shows_the_leaders_reasons_priorities_and_starts(bus: Bus) -> None:
    config = parse_config(CONFIG)
    leader = Scheduler(bus, config)  # no lease: always leads
    standby = Scheduler(bus, config)
    # A lease never taken: this process stands by (it reads nothing from the bucket in this test).
    standby.leader = Leadership(bus.js, "standby", 3.0, lambda: 0)
    stop = asyncio.Event()
    for scheduler in (leader, standby):
        await scheduler.rebuild()
    followers = [asyncio.create_task(s.follow(stop)) for s in (leader, standby)]
    try:
        await bus.append(ev.NodeRegistered(node="sq1", cpus=8, mem_mb=16384, gpus=4, partitions=["standby"]))
        base = await bus.next_job_id(4)  # ids of their own (other tests of the session use offsets)
        wide = ev.JobSpec(
            name="w",
            script="#!/bin/sh\n",
            workdir="/tmp",
            gpus_per_node=4,
            time_limit_s=600,
            partition="standby",
        )
        jobs = list(range(base, base + 4))
        for job in jobs:
            await bus.append(ev.JobSubmitted(job_id=job, user="alice", spec=wide))
        await settle(leader, bus)
        for _ in range(200):  # the leader allocates the first job at its next cycle
            if any(leader.state.jobs[j].state == "RUNNING" for j in jobs):
                break
            await asyncio.sleep(0.05)
        await settle(leader, bus)
        # Play the agent: the allocated job's run starts (its planned end, and so the others' planned
        # starts, then count from that fact, not from the time a plan is made).
        (running,) = [j for j in jobs if leader.state.jobs[j].state == "RUNNING"]
        await bus.append(ev.RunStarted(job_id=running, attempt=0, node="sq1", pid=1))
        await settle(leader, bus)
        await settle(standby, bus)
        assert not standby.leading() and standby.state.last_seq == leader.state.last_seq
        request = api.JobsRequest(job_ids=jobs)
        shown = await leader.jobs("alice", request), await standby.jobs("alice", request)
        # A planned start is the running job's end on the backfill resolution's grid (60 s here), a grid fixed
        # in time, and the cycle that started the job planned its end the same way: the leader's answer (its
        # last cycle's) and the standby's (a plan of its own, moments later) show the same instant (when the
        # grid was counted from each plan's time they differed, and a CI run of 2026-12-07 saw 1796608976
        # against 1796608977). The one exception: a grid point between the leader's plan and the allocation's
        # time, milliseconds later, which the run's end (from the allocation's time) then passes.
        rows = [sorted((j.job_id, j.state, j.reason, j.priority) for j in reply.jobs) for reply in shown]
        assert rows[0] == rows[1]
        starts = [{j.job_id: j.start_time for j in reply.jobs} for reply in shown]
        run_start = leader.state.jobs[running].start_time
        assert run_start is not None and leader.outlook.at is not None
        ends = {grid(run_start + 600), grid(leader.outlook.at + 600)}  # one instant, but in that exception
        first = jobs[1] if running == jobs[0] else jobs[0]  # the first pending job: it waits for the running
        assert starts[1][first] == grid(run_start + 600)
        assert starts[0][first] in ends
        assert [r[1] for r in rows[0]] == ["RUNNING", "PENDING", "PENDING", "PENDING"]
        assert [r[2] for r in rows[0][1:]] == ["Resources", "Priority", "Priority"]
        # The standby decided nothing: every decision in the log is the leader's (epoch 0, one allocation).
        allocations = [
            e async for e in bus.read(1) if isinstance(getattr(e.envelope, "body", None), ev.JobAllocated)
        ]
        assert [e.envelope.body.job_id for e in allocations if e.envelope.body.job_id in jobs] == jobs[:1]
    finally:
        stop.set()
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
