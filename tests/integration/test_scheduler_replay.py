"""The live scheduler's state equals the state rebuilt by replaying the log, byte for byte."""

from __future__ import annotations

import asyncio

import pytest

from corral.libs.config.cluster import parse_config
from corral.libs.core.state import encode_state
from corral.libs.runtime.bus import Bus
from corral.schemas import events as ev
from corral.services.scheduler.app import Scheduler

pytestmark = pytest.mark.integration

CONFIG = """
[[nodes]]
names = "rn[1-2]"
cpus = 8
memory = "16G"
gpus = 4
"""


async def settle(scheduler: Scheduler, bus: Bus) -> None:
    """Wait until the scheduler has applied the whole log and has nothing in flight."""
    for _ in range(200):
        last = await bus.last_seq()
        if scheduler.state.last_seq >= last and scheduler.inflight <= last and not scheduler.lock.locked():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("scheduler did not catch up")


async def test_live_state_equals_replayed_state(bus: Bus) -> None:
    config = parse_config(CONFIG)
    live = Scheduler(bus, config)
    await live.rebuild()
    stop = asyncio.Event()
    follower = asyncio.create_task(live.follow(stop))
    for name in ("rn1", "rn2"):
        await bus.append(ev.NodeRegistered(node=name, cpus=8, mem_mb=16384, gpus=4, partitions=["batch"]))
    base = await bus.next_job_id() + 1000
    spec = ev.JobSpec(name="r", script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=2, nodes=1)
    jobs = list(range(base, base + 6))
    for job in jobs:
        await bus.append(ev.JobSubmitted(job_id=job, user="alice", spec=spec))
    await bus.append(ev.JobCancelRequested(job_id=jobs[-1], user="alice"))
    # Play the agents: report every run of these jobs as started and exited (exit code = job % 2).
    reported: set[int] = set()
    for _ in range(400):
        await settle(live, bus)
        for job in jobs:
            rec = live.state.jobs[job]
            if rec.state == "RUNNING" and job not in reported:
                node = rec.allocations[0].node
                await bus.append(ev.RunStarted(job_id=job, attempt=0, node=node, pid=1))
                await bus.append(ev.RunExited(job_id=job, attempt=0, node=node, exit_code=job % 2))
                reported.add(job)
        if all(live.state.jobs[j].state not in ("PENDING", "RUNNING") for j in jobs):
            break
        await asyncio.sleep(0.05)
    await settle(live, bus)
    states = [live.state.jobs[j].state for j in jobs]
    assert states[:-1] == ["COMPLETED" if j % 2 == 0 else "FAILED" for j in jobs[:-1]]
    assert states[-1] in ("CANCELLED", "COMPLETED", "FAILED")
    stop.set()
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)

    replayed = Scheduler(bus, config)
    await replayed.rebuild()
    assert encode_state(replayed.state) == encode_state(live.state)
