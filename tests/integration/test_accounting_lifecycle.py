"""sacct shows what the scheduler shows: the projection into a real PostgreSQL follows the fold.

A known case first (a node goes down between the scheduler's plan and the append of its allocation), then
a property test: random logs are folded and projected, and every job's state, nodes, start and end agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg  # type: ignore[import-untyped, unused-ignore]
import pytest
from hypothesis import HealthCheck, given, settings
from random_logs import logs
from test_accounting import T0, Rig, acct, allocated, exited, rig, servers, submitted

from corral.libs.core.fold import fold
from corral.libs.core.state import State
from corral.libs.infra import NatsServer, PostgresServer
from corral.libs.runtime import store
from corral.schemas import events as ev
from corral.schemas.api import AcctReply, AcctRequest
from corral.schemas.codec import encode
from corral.services.accounting import sql
from corral.services.accounting.folded import Projector
from corral.services.accounting.projection import node_list

pytestmark = pytest.mark.integration

__all__ = ["rig", "servers"]  # the fixtures this module uses from test_accounting

#: The node goes down after the scheduler planned job 1 on it, before its JobAllocated is appended: the
#: fold refuses the allocation (the node is down), the scheduler places the job again on gpu02.
NODE_DOWN_BEFORE_ALLOCATION: list[ev.Event] = [
    ev.NodeRegistered(node=ev.NodeName("gpu01"), cpus=32, mem_mb=65536, gpus=8),  # seq 1
    ev.NodeRegistered(node=ev.NodeName("gpu02"), cpus=32, mem_mb=65536, gpus=8),
    submitted(1),
    ev.NodeDown(node=ev.NodeName("gpu01"), reason="Not responding"),
    allocated(1, 0, ["gpu01"]),  # seq 5: refused
    allocated(1, 0, ["gpu02"]),  # seq 6: the next cycle's
    exited(1, 0, "gpu02", 0),
    ev.JobCompleted(job_id=ev.JobId(1), attempt=0),  # seq 8
]


def entries(bodies: list[ev.Event]) -> list[tuple[int, ev.Envelope]]:
    """The log ``Rig.append`` writes: sequence n at T0 + n."""
    return [
        (seq, ev.Envelope(meta=ev.Meta(event_id=str(seq), occurred_at=T0 + seq, actor="test"), body=body))
        for seq, body in enumerate(bodies, start=1)
    ]


def shown(state: State, job_id: int) -> tuple[Any, ...]:
    """What the scheduler shows of a job: state, nodes, start, end, restart count."""
    job = state.jobs[job_id]
    nodes = node_list([a.node for a in job.allocations]) if job.allocations else ""
    return job.state, nodes, job.start_time, job.end_time, job.restart_count


async def test_a_node_down_before_the_allocation_is_appended(rig: Rig) -> None:
    await rig.append(*NODE_DOWN_BEFORE_ALLOCATION[:5])
    await rig.start()
    await rig.caught_up()
    scheduler = fold(entries(NODE_DOWN_BEFORE_ALLOCATION[:5]))
    assert shown(scheduler, 1) == ("PENDING", "", None, None, 0)
    reply = await acct(rig, encode(AcctRequest(job_ids=[1])))
    assert isinstance(reply, AcctReply)
    (job,) = reply.jobs
    assert (job.state, job.node_list, job.start_time, job.end_time, job.steps) == (
        "PENDING",
        "",
        None,
        None,
        [],
    )

    await rig.append(*NODE_DOWN_BEFORE_ALLOCATION[5:])
    await rig.caught_up()
    scheduler = fold(entries(NODE_DOWN_BEFORE_ALLOCATION))
    assert shown(scheduler, 1) == ("COMPLETED", "gpu02", T0 + 6, T0 + 8, 0)
    reply = await acct(rig, encode(AcctRequest(job_ids=[1])))
    assert isinstance(reply, AcctReply)
    (job,) = reply.jobs
    assert (job.state, job.node_list, job.start_time, job.end_time, job.restart_count) == shown(scheduler, 1)
    assert [(s.step, s.state, s.node_list, s.start_time) for s in job.steps] == [
        ("batch", "COMPLETED", "gpu02", T0 + 6)
    ]


class Database:
    """One connection to a migrated database, emptied before each example."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.runner = asyncio.Runner()
        self.conn: Any = None

    def __enter__(self) -> Database:
        self.runner.__enter__()
        self.runner.run(self._open())
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.run(self.conn.close())
        self.runner.__exit__(None, None, None)

    async def _open(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        await conn.close()
        pool = await store.create_pool(self.dsn)
        try:
            await store.migrate(pool, sql.migrations())
        finally:
            await pool.close()
        self.conn = await asyncpg.connect(self.dsn)

    def project(self, log: list[tuple[int, ev.Envelope]]) -> dict[int, tuple[Any, ...]]:
        """Project ``log`` into emptied tables; each job row's state, nodes, start, end and restarts."""
        return self.runner.run(self._project(log))

    async def _project(self, log: list[tuple[int, ev.Envelope]]) -> dict[int, tuple[Any, ...]]:
        conn = self.conn
        await conn.execute(
            "TRUNCATE jobs, steps, attempts, node_periods; UPDATE scheduler_epoch SET epoch = 0"
        )
        async with conn.transaction():
            await sql.apply_ops(conn, Projector().operations(log))
        rows = await conn.fetch(
            "SELECT job_id, state, node_list, start_time, end_time, restart_count FROM jobs ORDER BY job_id"
        )
        attempts = await conn.fetch(
            "SELECT job_id, attempt, state, start_time, end_time, node_list FROM attempts"
        )
        _check_attempts({row[0]: tuple(row[1:]) for row in rows}, [tuple(a) for a in attempts])
        return {row[0]: tuple(row[1:]) for row in rows}


def _check_attempts(jobs: dict[int, tuple[Any, ...]], attempts: list[tuple[Any, ...]]) -> None:
    """Every attempt row is of a run that ended before the job's latest, or is that run (same start, nodes,
    and end if the job has ended)."""
    for job_id, attempt, state, start, end, nodes in attempts:
        job_state, job_nodes, job_start, job_end, restarts = jobs[job_id]
        if attempt < restarts:
            assert end is not None and state in ("REQUEUED", "NODE_FAIL", "PREEMPTED"), (
                job_id,
                attempt,
                state,
            )
        else:
            assert attempt == restarts and job_start == start and job_nodes == nodes, (job_id, attempt)
            assert (state, end) == ((job_state, job_end) if job_end is not None else ("RUNNING", None))


@pytest.fixture(scope="module")
def database(servers: tuple[NatsServer, PostgresServer]) -> Iterator[Database]:
    with Database(servers[1].dsn) as db:
        yield db


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=logs())
def test_sacct_agrees_with_the_fold_on_random_logs(
    database: Database, log: list[tuple[int, ev.Envelope]]
) -> None:
    scheduler = fold(log)
    rows = database.project(log)
    assert {job_id: shown(scheduler, job_id) for job_id in scheduler.jobs} == rows


class Counted:
    """A real connection whose requests to the server are counted (the round trips a projection costs)."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.requests = conn, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.conn, name)
        if name not in ("execute", "executemany", "fetch", "fetchval", "fetchrow"):
            return method

        async def counted(*args: Any) -> Any:
            self.requests += 1
            return await method(*args)

        return counted


def test_a_batch_submission_is_projected_in_a_few_round_trips_not_one_per_row(database: Database) -> None:
    """50 jobs submitted, allocated, run and completed together (a batch submission's log): each kind of
    entry is one pipelined request for all 50 (it was ~9 requests a job, each a round trip)."""
    jobs = range(1, 51)
    nodes = [ev.NodeRegistered(node=ev.NodeName(f"n{i}"), cpus=128, mem_mb=65536, gpus=64) for i in (1, 2)]
    bodies: list[ev.Event] = [*nodes, *(submitted(j) for j in jobs)]
    bodies += [allocated(j, 0, [f"n{j % 2 + 1}"], gpus=(j // 2 * 2, j // 2 * 2 + 1)) for j in jobs]
    bodies += [exited(j, 0, f"n{j % 2 + 1}", 0) for j in jobs]
    bodies += [ev.JobCompleted(job_id=ev.JobId(j), attempt=0) for j in jobs]
    log = entries(bodies)

    async def project() -> tuple[int, list[tuple[Any, ...]]]:
        await database.conn.execute("TRUNCATE jobs, steps, attempts, node_periods")
        counted = Counted(database.conn)
        async with database.conn.transaction():
            await sql.apply_ops(counted, Projector().operations(log))  # type: ignore[arg-type]
        rows = await database.conn.fetch(
            "SELECT j.state, a.state, s.state, s.exit_code FROM jobs j JOIN attempts a USING (job_id)"
            " JOIN steps s USING (job_id, attempt) ORDER BY j.job_id"
        )
        return counted.requests, [tuple(r) for r in rows]

    requests, rows = database.runner.run(project())
    assert rows == [("COMPLETED", "COMPLETED", "COMPLETED", 0)] * 50
    # The node periods (one request: both nodes), then the submissions, allocations, exits, conclusions.
    assert requests <= 5, f"{requests} requests to the database for 50 jobs"
