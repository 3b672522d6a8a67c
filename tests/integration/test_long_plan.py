"""A plan that takes longer than the leader lease (a deep queue, conservative backfill on a big cluster: one
pass on 3,000 nodes and 30,000 pending jobs takes ~20 s here, bench/RESULTS.md) still decides: the leader
keeps renewing its lease while it plans, and its decisions go out (a real nats-server, the scheduler's
role, the scheduler's loops as ``process.py`` runs them).

Before, the plan held the event loop: the lease lapsed by the leader's own clock while it planned, every
decision was refused ("not the leader any more"), the lease was renewed (nobody had taken it) and the next
cycle planned as long again: nothing was ever decided."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from test_rebuild_paths import buses, server
from test_scheduler_cycle import CONFIG, registered, spec

from corral.libs.infra import roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import TransientError
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.scheduler import app, queries, snapshot
from corral.services.scheduler.app import Scheduler
from corral.services.scheduler.leadership import Leadership
from corral.services.scheduler.process import plan_on_takeover

pytestmark = pytest.mark.integration

# the fixtures this module uses from test_rebuild_paths: fresh streams, the scheduler's bus and the admin's
__all__ = ["buses", "server"]

#: The lease (the shortest the configuration allows) and how much longer than it a plan takes.
TTL_S = 0.5
PLAN_S = 4 * TTL_S


class Slower:
    """The real plan, after ``extra`` seconds of Python on the CPU (holding the interpreter as a long plan's
    own work does); each plan's (seconds, thread) recorded."""

    def __init__(self, plan: Callable[..., Any], extra: float) -> None:
        self.plan, self.extra = plan, extra
        self.plans: list[tuple[float, str]] = []
        self.began = threading.Event()  # set as a call begins

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.began.set()
        began = time.monotonic()
        while time.monotonic() - began < self.extra:
            pass
        self.plans.append((time.monotonic() - began, threading.current_thread().name))
        return self.plan(*args, **kwargs)


async def running(live: Scheduler, jobs: tuple[int, ...], within: float) -> set[int]:
    """The leader's epochs seen until ``jobs`` run (or ``within`` seconds passed)."""
    assert live.leader is not None
    epochs: set[int] = set()
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if live.leader.epoch:  # (0: before it first took the lease)
            epochs.add(live.leader.epoch)
        if all(j in live.state.jobs and live.state.jobs[j].state == "RUNNING" for j in jobs):
            break
        await asyncio.sleep(0.05)
    return epochs


async def slowed(buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch, module: types.ModuleType) -> Slower:
    """The nodes and job 1 in the log; ``module``'s plan ``PLAN_S`` longer."""
    await registered(buses[1])
    await buses[1].append(ev.JobSubmitted(job_id=1, user="alice", spec=spec("j1")))
    slow = Slower(module.plan_paused, PLAN_S)
    monkeypatch.setattr(module, "plan_paused", slow)
    return slow


@contextlib.asynccontextmanager
async def one_running(buses: tuple[Bus, Bus]) -> AsyncIterator[Scheduler]:
    """A leader running its loops, with job 1 running."""
    bus, admin = buses
    await registered(admin)
    await admin.append(ev.JobSubmitted(job_id=1, user="alice", spec=spec("j1")))
    live = Scheduler(bus, CONFIG)
    async with loops(live):
        await running(live, (1,), 10.0)
        assert live.state.jobs[1].state == "RUNNING"
        yield live


@contextlib.asynccontextmanager
async def ticking() -> AsyncIterator[list[float]]:
    """A task asking for a turn of the loop every 50 ms while the block runs: the times it got one. A block
    that holds the loop for its 2 s gives it none (or the one or two of an await before); one that leaves the
    loop going, about 40."""
    turns: list[float] = []

    async def tick() -> None:
        while True:
            turns.append(time.monotonic())
            await asyncio.sleep(0.05)

    ticker = asyncio.create_task(tick())
    try:
        yield turns
    finally:
        ticker.cancel()


@contextlib.asynccontextmanager
async def loops(live: Scheduler) -> AsyncIterator[None]:
    """The scheduler's loops as ``process.py`` runs them."""
    live.leader = Leadership(live.bus.js, "long-planner", TTL_S, lambda: live.state.epoch)
    await live.rebuild()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(live.follow(stop)),
        asyncio.create_task(live.ticker(stop)),
        asyncio.create_task(live.leader.run(stop)),
        asyncio.create_task(plan_on_takeover(types.SimpleNamespace(stop=stop), live)),  # type: ignore[arg-type]
    ]
    try:
        yield
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_plan_longer_than_the_lease_decides_and_the_leader_keeps_its_lease(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await registered(admin)
    for job_id in (1, 2, 3):
        await admin.append(ev.JobSubmitted(job_id=job_id, user="alice", spec=spec(f"j{job_id}")))
    slow = Slower(app.plan_paused, PLAN_S)
    monkeypatch.setattr(app, "plan_paused", slow)
    live = Scheduler(bus, CONFIG)
    async with loops(live):
        epochs = await running(live, (1, 2, 3), 8 * PLAN_S)
    states = {j: live.state.jobs[j].state for j in (1, 2, 3)}
    assert states == {1: "RUNNING", 2: "RUNNING", 3: "RUNNING"}, (states, slow.plans)
    # One leader throughout: its lease never lapsed (a lapse is a takeover with the next epoch).
    assert epochs == {1}, epochs
    assert slow.plans and all(s >= PLAN_S and thread.startswith("scheduler-plan") for s, thread in slow.plans)


async def test_a_plan_that_grows_past_the_lease_is_refused_once_then_planned_aside(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short plans run on the loop (handing them to the thread costs more than they do); one that grows past
    the lease in one cycle has its decisions refused, and the next plan runs in the thread and decides."""
    bus, admin = buses
    await registered(admin)
    await admin.append(ev.JobSubmitted(job_id=1, user="alice", spec=spec("j1")))
    slow = Slower(app.plan_paused, 0.0)
    monkeypatch.setattr(app, "plan_paused", slow)
    live = Scheduler(bus, CONFIG)
    async with loops(live):
        await running(live, (1,), 10.0)
        assert live.state.jobs[1].state == "RUNNING"
        await admin.append(ev.JobSubmitted(job_id=2, user="alice", spec=spec("j2")))
        await running(live, (2,), 10.0)  # short plans: on the loop
        assert live.state.jobs[2].state == "RUNNING"
        short = len(slow.plans)
        slow.extra = PLAN_S
        await admin.append(ev.JobSubmitted(job_id=3, user="alice", spec=spec("j3")))
        await running(live, (3,), 8 * PLAN_S)
    assert live.state.jobs[3].state == "RUNNING", slow.plans
    threads = [thread for _, thread in slow.plans]
    assert threads[0].startswith("scheduler-plan")  # the first plan: none measured yet
    assert "MainThread" in threads[1:short]
    grown = threads[short:]
    assert grown[0] == "MainThread" and any(t.startswith("scheduler-plan") for t in grown[1:]), grown


async def test_a_long_will_run_holds_neither_the_loop_nor_the_lease(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sbatch --test-only`` plans the whole queue conservatively (seconds on a big cluster): it runs in the
    planning thread too, the loop going on (here a ticker every 50 ms), and answers as before."""
    slow = Slower(queries.will_run, PLAN_S)
    monkeypatch.setattr(queries, "will_run", slow)
    async with one_running(buses) as live, ticking() as turns:
        got = await live.will_run(roles.GATEWAY, api.WillRunRequest(user="bob", spec=spec("what-if")))
    assert got.job_id == 2 and got.start is not None and len(got.nodes) == 1, got
    assert len(turns) >= 10, turns  # the loop went on (a count of turns, not a time: none on the loop)
    assert slow.plans and slow.plans[0][1].startswith("scheduler-plan")
    assert 2 not in live.state.jobs  # the hypothetical job was never in the state


async def test_a_long_snapshot_encode_holds_neither_the_loop_nor_the_lease(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader's snapshot (a million jobs: ~1 s to encode) is encoded in the planning thread, the fold held
    back, and compressed beside the loop: the loop goes on, and the snapshot is the state's."""
    slow = Slower(snapshot.encode, PLAN_S)
    monkeypatch.setattr(snapshot, "encode", slow)
    async with one_running(buses) as live:
        live.snapshot_every = 1
        async with ticking() as turns:
            await live.maybe_snapshot()
    assert len(turns) >= 10, turns  # the loop went on (a count of turns, not a time: none on the loop)
    assert slow.plans and slow.plans[0][1].startswith("scheduler-plan")
    assert live.snapshot_seq == live.state.last_seq
    loaded, _ = await snapshot.load(live.bus)
    assert loaded is not None and loaded.jobs[1].state == "RUNNING"


async def test_a_request_folded_after_a_plan_in_the_thread_is_not_overtaken_by_its_decisions(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hold requested while the plan that starts the job runs in the thread: the allocation, taken before
    the hold, must not pass the conditional append (its job's sequence is the one the plan saw), and the
    next plan answers the hold."""
    slow = await slowed(buses, monkeypatch, app)
    live = Scheduler(buses[0], CONFIG)
    async with loops(live):
        while not slow.began.is_set():
            await asyncio.sleep(0.01)
        await buses[1].append(ev.JobHoldRequested(job_id=1, user="alice"))
        deadline = time.monotonic() + 8 * PLAN_S
        while time.monotonic() < deadline and live.state.jobs[1].held != "user":
            await asyncio.sleep(0.05)
    job = live.state.jobs[1]
    assert (job.state, job.held) == ("PENDING", "user"), (job.state, job.held, job.control)


async def test_steady_work_in_the_thread_does_not_starve_the_fold(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``sbatch --test-only`` in the thread at all times (each 1 s of planning here): the fold still
    gets its turn between them, catches up, and a job submitted meanwhile starts."""
    slow = Slower(queries.will_run, PLAN_S / 2)
    monkeypatch.setattr(queries, "will_run", slow)
    async with one_running(buses) as live:
        asked = api.WillRunRequest(user="bob", spec=spec("what-if"))
        stop = asyncio.Event()

        async def asking() -> None:
            while not stop.is_set():
                try:
                    await live.will_run(roles.GATEWAY, asked)
                except TransientError:  # the other asker's is being planned: one at a time
                    await asyncio.sleep(0.01)

        askers = [asyncio.create_task(asking()) for _ in range(2)]
        try:
            while len(slow.plans) < 2:  # both in the thread's queue, one after the other
                await asyncio.sleep(0.05)
            await buses[1].append(ev.JobSubmitted(job_id=2, user="alice", spec=spec("j2")))
            await running(live, (2,), 6 * PLAN_S)
        finally:
            stop.set()
            await asyncio.gather(*askers, return_exceptions=True)
        assert live.state.jobs[2].state == "RUNNING", len(slow.plans)


async def test_a_second_will_run_meanwhile_is_refused_not_queued(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While one ``sbatch --test-only`` is planned (2 s here), another is refused at once, retryable, instead
    of queueing behind it (queued ones would hold the fold and the leader's next plan back for as long as
    they all take); the first answers, and one asked after it is planned."""
    slow = Slower(queries.will_run, PLAN_S)
    monkeypatch.setattr(queries, "will_run", slow)
    asked = api.WillRunRequest(user="bob", spec=spec("what-if"))
    async with one_running(buses) as live:
        first = asyncio.create_task(live.will_run(roles.GATEWAY, asked))
        while not slow.began.is_set():
            await asyncio.sleep(0.01)
        with pytest.raises(TransientError, match="another sbatch --test-only") as refused:
            await live.will_run(roles.GATEWAY, asked)
        assert refused.value.retryable
        assert (await first).start is not None and len(slow.plans) == 1
        assert (await live.will_run(roles.GATEWAY, asked)).start is not None
    assert len(slow.plans) == 2


async def test_a_standbys_plan_for_a_query_leaves_its_loop_going(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby answers squeue from a plan of its own (``Scheduler.view``): a deep queue's takes seconds, in
    the planning thread as the leader's does, so its loop (its lease polls, its other answers) goes on."""
    slow = await slowed(buses, monkeypatch, queries)
    standby = Scheduler(buses[0], CONFIG)
    standby.leader = Leadership(buses[0].js, "standby", TTL_S, lambda: 0)  # never run: it stands by
    await standby.rebuild()
    async with ticking() as turns:
        reply = await standby.jobs("alice", api.JobsRequest())
    assert [(j.job_id, j.state) for j in reply.jobs] == [(1, "PENDING")]
    assert len(turns) >= 10, turns  # the loop went on (a count of turns, not a time: none on the loop)
    assert slow.plans and slow.plans[0][1].startswith("scheduler-plan")
