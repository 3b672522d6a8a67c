"""Scheduler snapshots: start = snapshot + tail gives the full replay's state; a bad snapshot is ignored."""

from __future__ import annotations

import asyncio

import pytest

from corral.libs.config.cluster import parse_config
from corral.libs.core.state import encode_state
from corral.libs.runtime.bus import Bus
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.scheduler import snapshot
from corral.services.scheduler.app import Scheduler

pytestmark = pytest.mark.integration

CONFIG = """
[scheduler]
snapshot_every = 5

[[nodes]]
names = "sn[1-2]"
cpus = 8
memory = "16G"
gpus = 4
"""


async def caught_up(scheduler: Scheduler, bus: Bus) -> None:
    for _ in range(200):
        if scheduler.state.last_seq >= await bus.last_seq() and not scheduler.lock.locked():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("scheduler did not catch up")


async def full_replay(bus: Bus) -> bytes:
    fresh = Scheduler(bus, parse_config(CONFIG))
    await fresh.rebuild(use_snapshot=False)
    return encode_state(fresh.state)


async def from_snapshot(bus: Bus) -> tuple[bytes, int]:
    fresh = Scheduler(bus, parse_config(CONFIG))
    await fresh.rebuild()
    return encode_state(fresh.state), fresh.snapshot_seq


async def test_snapshot_plus_tail_equals_full_replay(bus: Bus) -> None:
    live = Scheduler(bus, parse_config(CONFIG))
    await live.rebuild()
    stop = asyncio.Event()
    follower = asyncio.create_task(live.follow(stop))
    for name in ("sn1", "sn2"):
        await bus.append(ev.NodeRegistered(node=name, cpus=8, mem_mb=16384, gpus=4, partitions=["batch"]))
    base = await bus.next_job_id() + 5000
    # A partition without nodes: these jobs stay pending and take no capacity from other tests.
    spec = ev.JobSpec(name="s", script="#!/bin/sh\n", workdir="/tmp", gpus_per_node=1, partition="parked")
    for job in range(base, base + 12):
        await bus.append(ev.JobSubmitted(job_id=job, user="alice", spec=spec))
    await caught_up(live, bus)
    stop.set()
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    assert live.snapshot_seq > 0, "a snapshot is taken every 5 entries"

    # The tail after the snapshot is replayed on top of it.
    for job in range(base + 12, base + 15):
        await bus.append(ev.JobSubmitted(job_id=job, user="alice", spec=spec))
    state, used = await from_snapshot(bus)
    assert used == live.snapshot_seq
    assert state == await full_replay(bus)


async def test_a_corrupt_or_foreign_snapshot_falls_back_to_a_full_replay(bus: Bus) -> None:
    await bus.append(ev.NodeUp(node="sn9"))
    store = await bus.js.object_store(subjects.SNAPSHOT_BUCKET)
    await store.put(snapshot.NAME, b"{not a snapshot")
    state, used = await from_snapshot(bus)
    assert used == 0 and state == await full_replay(bus)
    loaded, why = await snapshot.load(bus)
    assert loaded is None and "does not decode" in why
    # Compressed, but not a snapshot inside.
    await store.put(snapshot.NAME, snapshot.compress([b"\x93not a snapshot"]))
    loaded, why = await snapshot.load(bus)
    assert loaded is None and "does not decode" in why

    # A well-formed snapshot whose anchor entry is not in this log (another cluster's, or a reset log).
    replayed = Scheduler(bus, parse_config(CONFIG))
    await replayed.rebuild(use_snapshot=False)
    foreign = snapshot.Snapshot(format=snapshot.FORMAT, event_id="not-this-log", state=replayed.state)
    await store.put(snapshot.NAME, snapshot.compress(snapshot.encode(foreign)))
    loaded, why = await snapshot.load(bus)
    assert loaded is None and "another log" in why


async def test_a_snapshot_that_forgets_ended_jobs_at_another_age_is_not_used(bus: Bus) -> None:
    # Its state forgot (or kept) other jobs than this configuration's fold would: replayed in full instead.
    await bus.append(ev.NodeUp(node="sn8"))
    before = Scheduler(bus, parse_config(CONFIG.replace("snapshot_every = 5", "min_job_age = 60")))
    await before.rebuild(use_snapshot=False)
    await snapshot.save(bus, before.state)
    again = Scheduler(bus, parse_config(CONFIG.replace("snapshot_every = 5", "min_job_age = 60")))
    await again.rebuild()
    assert again.snapshot_seq == before.state.last_seq  # the same age: used
    now = Scheduler(bus, parse_config(CONFIG))
    await now.rebuild()
    assert now.snapshot_seq == 0 and now.state.min_job_age_s == 300.0
    assert encode_state(now.state) == await full_replay(bus)
