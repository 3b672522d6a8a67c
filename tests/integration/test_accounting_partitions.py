"""Two accounting processes share the projection (``[accounting] partitions = 2``), on a real nats-server and
PostgreSQL: together they write exactly the tables one projection writes, each applies about half of the job
rows, one takes over the other's partition when it dies and hands it back when it is restarted, and a
database projected with one partition carries on with two (and back)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from nats.js.errors import NotFoundError
from test_accounting import Rig, allocated, array_submitted, exited, rig, servers, submitted
from test_accounting_lifecycle import entries

from corral.libs.core.partition_claims import partition_name
from corral.libs.infra import roles
from corral.libs.runtime import store
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.streams import connect, declare
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.services.accounting import sql
from corral.services.accounting.app import AccountingService
from corral.services.accounting.folded import Projector
from corral.services.accounting.ops import NodeChange, RaiseEpoch

pytestmark = pytest.mark.integration

__all__ = ["rig", "servers"]  # the fixtures this module uses from test_accounting

TTL = 1.0
LIVE: list[Instance] = []  # every accounting process a test started, stopped by ``no_survivors`` if it fails
NODES = [f"n{i}" for i in range(1, 5)]


def log() -> list[ev.Event]:
    """About 300 entries over 50 jobs and a 9-task array: every 5th job is requeued and runs again, every
    7th fails, every 11th is cancelled while pending, two steps per 3rd job, and a node goes down and up."""
    bodies: list[ev.Event] = [
        ev.NodeRegistered(node=ev.NodeName(n), cpus=32, mem_mb=65536, gpus=8) for n in NODES
    ]
    for job in range(1, 51):
        node = NODES[job % len(NODES)]
        bodies.append(submitted(job, user="alice" if job % 2 else "bob"))
        if job % 11 == 0:
            bodies += [
                ev.JobCancelRequested(job_id=ev.JobId(job), user="alice"),
                ev.JobCancelled(job_id=ev.JobId(job), attempt=-1, by="alice"),
            ]
            continue
        attempt = 0
        bodies.append(allocated(job, 0, [node]))
        if job % 5 == 0:
            bodies += [
                ev.JobRequeued(job_id=ev.JobId(job), attempt=0, reason="Requested"),
                exited(job, 0, node, 143),
                allocated(job, 1, [node]),
            ]
            attempt = 1
        if job % 3 == 0:
            for step in (0, 1):
                bodies += [
                    ev.StepStarted(
                        job_id=ev.JobId(job),
                        attempt=attempt,
                        step_id=step,
                        node=ev.NodeName(node),
                        name="srun",
                        nodes=[ev.NodeName(node)],
                        cpus=4,
                        ntasks=1,
                        gpus=2,
                    ),
                    ev.StepExited(
                        job_id=ev.JobId(job),
                        attempt=attempt,
                        step_id=step,
                        node=ev.NodeName(node),
                        exit_code=step,
                    ),
                ]
        code = 3 if job % 7 == 0 else 0
        bodies.append(exited(job, attempt, node, code))
        if code:
            bodies.append(
                ev.JobFailed(job_id=ev.JobId(job), attempt=attempt, reason="NonZeroExitCode", exit_code=3)
            )
        else:
            bodies.append(ev.JobCompleted(job_id=ev.JobId(job), attempt=attempt))
        if job == 25:
            bodies += [
                ev.NodeDown(node=ev.NodeName("n4"), reason="Not responding"),
                ev.NodeUp(node=ev.NodeName("n4")),
            ]
    bodies.append(array_submitted(51, "0-8"))
    for task in range(51, 60):
        node = NODES[task % len(NODES)]
        bodies += [
            allocated(task, 0, [node]),
            exited(task, 0, node, 0),
            ev.JobCompleted(job_id=ev.JobId(task), attempt=0),
        ]
    return bodies


def job_ops(bodies: list[ev.Event], after: int) -> int:
    """How many job, attempt and step row operations the entries past ``after`` make (one projection)."""
    projector = Projector("gpu")
    ops = [op for seq, env in entries(bodies) for op in projector.operations([(seq, env)]) if seq > after]
    return sum(not isinstance(op, NodeChange | RaiseEpoch) for op in ops)


class Instance:
    """One accounting process (replica ``replica`` of a projection in ``partitions``), with its own NATS
    connection and pool, as ``python -m corral.services.accounting --replica N`` runs."""

    def __init__(self, rig: Rig, replica: int, partitions: int = 2) -> None:
        self.rig, self.replica, self.partitions = rig, replica, partitions
        self.stop = asyncio.Event()
        self.service: AccountingService | None = None
        self.task = asyncio.create_task(self._serve())
        LIVE.append(self)

    async def _serve(self) -> None:
        nc = await connect(self.rig.creds(roles.ACCOUNTING), name=f"accounting-{self.replica}")
        pool = await store.create_pool(self.rig.dsn)
        try:
            await store.migrate(pool, sql.migrations())
            self.service = AccountingService(
                Bus(nc, actor=roles.ACCOUNTING),
                pool,
                default_partition="gpu",
                partitions=self.partitions,
                replica=self.replica,
                name=f"accounting-{self.replica}",
                lease_ttl_s=TTL,
            )
            await self.service.run(self.stop)
        finally:
            await pool.close()
            await nc.close()

    def held(self) -> list[int]:
        """The partitions this process projects now."""
        if self.service is None or self.service.holder is None:
            return []
        return self.service.holder.held()

    def applied(self) -> int:
        return 0 if self.service is None else self.service.applied()

    async def stopped(self) -> None:
        """A clean stop: its partitions are handed back."""
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=15)

    async def crashed(self) -> None:
        """A death: the task ends, releasing no lease and leaving its presence to go stale."""
        assert self.service is not None and self.service.holder is not None
        for held in self.service.holder.leases:
            held.release = _nothing  # type: ignore[method-assign]
            held.delete = _ignore  # type: ignore[method-assign]
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def _nothing() -> None:
    return None


async def _ignore(key: str) -> None:
    return None


@pytest.fixture(autouse=True)
async def no_survivors() -> AsyncIterator[None]:
    """A test that fails leaves no accounting process running into the next one (which would apply the next
    test's entries in place of that test's own instances)."""
    yield
    while LIVE:
        instance = LIVE.pop()
        instance.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await instance.task


async def until(check: Callable[[], Awaitable[bool] | bool], what: str, timeout: float = 30) -> float:
    """Seconds until ``check()`` holds; fails after ``timeout``."""
    started = time.monotonic()
    while True:
        result = check()
        if await result if isinstance(result, Awaitable) else result:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"timed out waiting until {what}"
        await asyncio.sleep(0.05)


async def positions_at_end(rig: Rig, partitions: int) -> None:
    """Wait until every partition's position is the log's last entry and its consumer has nothing unacked."""
    last = await rig.bus.last_seq()
    names = [partition_name(k, partitions) for k in range(partitions)]

    async def done() -> bool:
        try:
            rows = dict(await rig.sql("SELECT consumer, last_seq FROM consumer_positions"))
        except asyncpg.UndefinedTableError:
            return False  # no instance has migrated the emptied database yet (a loaded machine is slower)
        if any(rows.get(name, 0) < last for name in names):
            return False
        for name in names:
            try:
                info = await rig.bus.js.consumer_info(subjects.EVENTS_STREAM, name)
            except NotFoundError:
                return False
            if info.num_ack_pending:
                return False
        return True

    await until(done, f"every partition applied entry {last}")


async def fresh_leases(rig: Rig) -> None:
    """An empty leader bucket: no lease or presence of an earlier test's processes."""
    with contextlib.suppress(NotFoundError):
        await rig.bus.js.delete_stream(f"KV_{subjects.LEADER_BUCKET}")
    await declare(rig.bus.js)


async def single_projection(rig: Rig) -> list[list[tuple[Any, ...]]]:
    """The tables one projection (one partition, no lease) makes of the log, on an emptied database."""
    await rig.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    for name in (partition_name(0, 1), partition_name(0, 2), partition_name(1, 2)):
        with contextlib.suppress(NotFoundError):
            await rig.bus.js.delete_consumer(subjects.EVENTS_STREAM, name)
    await rig.start()
    await rig.caught_up()
    expected = await rig.dump()
    await rig.stop()
    return expected


async def test_two_processes_write_the_tables_one_projection_writes_each_about_half(rig: Rig) -> None:
    await fresh_leases(rig)
    both = [Instance(rig, 0), Instance(rig, 1)]
    await until(lambda: [i.held() for i in both] == [[0], [1]], "each holds its own partition")
    bodies = log()
    assert len(bodies) >= 250
    await rig.append(*bodies)
    await positions_at_end(rig, 2)
    shared = await rig.dump()
    jobs = {row[0] for row in shared[0]}
    assert jobs == set(range(1, 60))  # every job and every array task, once
    counts = [i.applied() for i in both]
    assert all(0.35 < n / sum(counts) < 0.65 for n in counts), counts
    for instance in both:
        await instance.stopped()
    assert await single_projection(rig) == shared


async def test_a_survivor_takes_over_a_dead_partition_and_hands_it_back_on_restart(rig: Rig) -> None:
    await fresh_leases(rig)
    bodies = log()
    half = len(bodies) // 2
    a, b = Instance(rig, 0), Instance(rig, 1)
    await until(lambda: (a.held(), b.held()) == ([0], [1]), "each holds its own partition")
    await rig.append(*bodies[:half])
    await positions_at_end(rig, 2)
    await b.crashed()
    await rig.append(*bodies[half:])
    waited = await until(lambda: a.held() == [0, 1], "the survivor holds both partitions", timeout=10 * TTL)
    assert waited < 5 * TTL
    await positions_at_end(rig, 2)
    converged = await rig.dump()
    b = Instance(rig, 1)
    await until(lambda: (a.held(), b.held()) == ([0], [1]), "the restarted process has its partition back")
    more = [submitted(100), allocated(100, 0, ["n1"]), submitted(101), allocated(101, 0, ["n2"])]
    await rig.append(*more)
    await positions_at_end(rig, 2)
    assert b.applied() > 0  # job 101's rows, partition 1's
    after = await rig.dump()
    for instance in (a, b):
        await instance.stopped()
    expected = await single_projection(rig)
    assert after == expected
    assert [row for row in converged[0]] == [row for row in expected[0] if row[0] < 100]


@pytest.mark.parametrize(
    ("before", "after"), [(1, 2), (2, 1), (2, 3)], ids=["one-to-two", "two-to-one", "two-to-three"]
)
async def test_changing_the_partition_count_converges(rig: Rig, before: int, after: int) -> None:
    await fresh_leases(rig)
    bodies = log()
    half = len(bodies) // 2
    first = [Instance(rig, r, partitions=before) for r in range(before)]
    await rig.append(*bodies[:half])
    await positions_at_end(rig, before)
    for instance in first:
        await instance.stopped()
    await rig.append(*bodies[half:])
    then = [Instance(rig, r, partitions=after) for r in range(after)]
    await positions_at_end(rig, after)
    rows = dict(await rig.sql("SELECT consumer, partitions FROM consumer_positions"))
    assert {rows[partition_name(k, after)] for k in range(after)} == {after}
    changed = await rig.dump()
    # The new partitions started where the old ones had got to: they applied the second half's operations
    # (an array's insert once per partition with a task of it), not the first half's.
    tail, total = job_ops(bodies, half), job_ops(bodies, 0)
    assert tail <= sum(i.applied() for i in then) < total
    for instance in then:
        await instance.stopped()
    assert await single_projection(rig) == changed
