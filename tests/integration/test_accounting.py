"""The accounting service against a real nats-server and PostgreSQL.

Each test starts from empty streams and an empty database, appends a log, runs the service (as the
accounting role, with its NATS permissions) and looks at the tables and at the sacct API.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped, unused-ignore]
import msgspec
import pytest
from nats.js.errors import NotFoundError

from corral.cli.client import Cluster
from corral.libs.infra import NatsServer, PostgresServer, roles
from corral.libs.runtime import store
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.libs.slurm.array import parse_array
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.schemas.api import (
    AcctAttempt,
    AcctJob,
    AcctReply,
    AcctRequest,
    AcctStep,
    ApiError,
    ReportReply,
    ReportRequest,
    TresCapacity,
    TresUsage,
)
from corral.schemas.codec import encode
from corral.services.accounting import partition, query, sql
from corral.services.accounting.app import CONSUMER, AccountingService

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
PASSWORDS = {roles.ADMIN: "admin-secret", roles.ACCOUNTING: "acct-secret", "alice": "alice-secret"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, PostgresServer]]:
    users = [
        roles.service_user(roles.ADMIN, PASSWORDS[roles.ADMIN]),
        roles.service_user(roles.ACCOUNTING, PASSWORDS[roles.ACCOUNTING]),
        roles.user_user("alice", PASSWORDS["alice"]),
    ]
    with (
        NatsServer(Path(tmp_path_factory.mktemp("nats")), users) as nats_server,
        PostgresServer(Path(tmp_path_factory.mktemp("pg"))) as pg_server,
    ):
        yield nats_server, pg_server


class Rig:
    """Empty streams and database, an admin bus to append with, and the service to start and stop."""

    def __init__(self, nats_url: str, dsn: str, bus: Bus) -> None:
        self.nats_url, self.dsn, self.bus = nats_url, dsn, bus
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def creds(self, user: str) -> Credentials:
        return Credentials(url=self.nats_url, user=user, password=PASSWORDS[user])

    async def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        # A fresh connection each time: the tables may have been dropped and recreated since.
        conn = await asyncpg.connect(self.dsn)
        try:
            return [tuple(row) for row in await conn.fetch(query, *args)]
        finally:
            await conn.close()

    async def execute(self, statements: str) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(statements)
        finally:
            await conn.close()

    async def dump(self) -> list[list[tuple[Any, ...]]]:
        """Every row of the read model, in a fixed order."""
        return [
            await self.sql("SELECT * FROM jobs ORDER BY job_id"),
            await self.sql("SELECT * FROM steps ORDER BY job_id, attempt, step"),
            await self.sql("SELECT * FROM scheduler_epoch"),
            await self.sql("SELECT * FROM attempts ORDER BY job_id, attempt"),
            await self.sql("SELECT * FROM node_periods ORDER BY node, start_seq"),
        ]

    async def start(self) -> None:
        """Run the service as its own process would: own NATS connection, own pool."""
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._serve(self._stop))

    async def _serve(self, stop: asyncio.Event) -> None:
        nc = await connect(self.creds(roles.ACCOUNTING), name="accounting-under-test")
        pool = await store.create_pool(self.dsn)
        try:
            await store.migrate(pool, sql.migrations())
            await AccountingService(Bus(nc, actor=roles.ACCOUNTING), pool, default_partition="gpu").run(stop)
        finally:
            await pool.close()
            await nc.close()

    async def stop(self) -> None:
        if self._task is not None:
            self._stop.set()
            task, self._task = self._task, None
            await asyncio.wait_for(task, timeout=15)

    async def until(self, check: Callable[[], Awaitable[bool]], what: str) -> None:
        deadline = time.monotonic() + 30
        while not await check():
            if self._task is not None and self._task.done():
                self._task.result()  # the service died: show why
                raise AssertionError("the service stopped")
            assert time.monotonic() < deadline, f"timed out waiting until {what}"
            await asyncio.sleep(0.05)

    async def caught_up(self) -> None:
        """Wait until every entry of the log is applied and acknowledged (and so the API served)."""
        last = await self.bus.last_seq()

        async def done() -> bool:
            try:
                info = await self.bus.js.consumer_info(subjects.EVENTS_STREAM, CONSUMER)
            except NotFoundError:
                return False
            try:
                rows = await self.sql("SELECT last_seq FROM consumer_positions WHERE consumer = $1", CONSUMER)
            except asyncpg.UndefinedTableError:
                return False  # not migrated yet
            applied = (rows[0][0] if rows else 0) >= last
            return applied and info.delivered.stream_seq >= last and not info.num_ack_pending

        await self.until(done, f"entry {last} is applied")

    async def append(self, *bodies: ev.Event) -> None:
        for body in bodies:
            await self.bus.append(body, occurred_at=T0 + await self.bus.last_seq() + 1)


@pytest.fixture
async def rig(servers: tuple[NatsServer, PostgresServer]) -> AsyncIterator[Rig]:
    nats_server, pg_server = servers
    nc = await connect(
        Credentials(url=nats_server.url, user=roles.ADMIN, password=PASSWORDS[roles.ADMIN]), name="test"
    )
    js = nc.jetstream()
    for stream in (subjects.EVENTS_STREAM, subjects.DLQ_STREAM, subjects.WORK_STREAM):
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(stream)
    await declare(js)
    rig = Rig(nats_server.url, pg_server.dsn, Bus(nc, actor="test"))
    await rig.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    try:
        yield rig
    finally:
        await rig.stop()
        await nc.close()


def submitted(
    job: int, user: str = "alice", nodes: int = 1, name: str = "train", qos: str | None = None
) -> ev.JobSubmitted:
    spec = ev.JobSpec(
        name=name, script="#!/bin/sh\n", workdir="/home/alice", nodes=nodes, gpus_per_node=2, qos=qos
    )
    return ev.JobSubmitted(job_id=ev.JobId(job), user=user, spec=spec)


def allocated(
    job: int, attempt: int, nodes: list[str], epoch: int = 0, gpus: tuple[int, int] = (0, 1)
) -> ev.JobAllocated:
    allocations = [ev.NodeAllocation(node=ev.NodeName(n), gpus=list(gpus), cpus=4) for n in nodes]
    return ev.JobAllocated(
        job_id=ev.JobId(job),
        attempt=attempt,
        partition="gpu",
        allocations=allocations,
        time_limit_s=600,
        epoch=epoch,
    )


def exited(job: int, attempt: int, node: str, exit_code: int) -> ev.RunExited:
    return ev.RunExited(job_id=ev.JobId(job), attempt=attempt, node=ev.NodeName(node), exit_code=exit_code)


#: A log with every path: completed, failed (exit 3), cancelled while pending, requeued and
#: running again, a fenced-off allocation (stale epoch) and a stale conclusion, both ignored.
SCENARIO: list[ev.Event] = [
    ev.NodeRegistered(node=ev.NodeName("gpu01"), cpus=32, mem_mb=65536, gpus=8),  # seq 1
    ev.NodeRegistered(node=ev.NodeName("gpu02"), cpus=32, mem_mb=65536, gpus=8),
    submitted(1),
    allocated(1, 0, ["gpu01"]),
    ev.RunStarted(job_id=ev.JobId(1), attempt=0, node=ev.NodeName("gpu01"), pid=100),  # seq 5
    exited(1, 0, "gpu01", 0),
    ev.JobCompleted(job_id=ev.JobId(1), attempt=0),
    submitted(2),
    allocated(2, 0, ["gpu02"]),
    exited(2, 0, "gpu02", 3),  # seq 10
    ev.JobFailed(job_id=ev.JobId(2), attempt=0, reason="NonZeroExitCode", exit_code=3),
    submitted(3),
    ev.JobCancelRequested(job_id=ev.JobId(3), user="alice"),
    ev.JobCancelled(job_id=ev.JobId(3), attempt=-1, by="alice"),
    submitted(4, nodes=2),  # seq 15
    allocated(4, 0, ["gpu01", "gpu02"]),
    ev.NodeDown(node=ev.NodeName("gpu02"), reason="Not responding"),
    ev.JobRequeued(job_id=ev.JobId(4), attempt=0, reason="NodeFail"),
    ev.NodeUp(node=ev.NodeName("gpu02")),
    # GPUs 0-1 of gpu01 stay held until attempt 0's batch script is seen to exit (as in the fold).
    allocated(4, 1, ["gpu01", "gpu02"], epoch=2, gpus=(2, 3)),  # seq 20
    ev.JobCompleted(job_id=ev.JobId(4), attempt=0, epoch=2),  # stale: that attempt was requeued
    submitted(5, user="bob", name="eval"),
    allocated(5, 0, ["gpu02"], epoch=1),  # fenced off: epoch 2 was seen
]


def job(job_id: int, state: str, **fields: Any) -> AcctJob:
    base: dict[str, Any] = {
        "job_id": job_id,
        "name": "train",
        "user": "alice",
        "account": "",
        "partition": "gpu",
        "state": state,
        "cancelled_by": None,
        "exit_code": 0,
        "signal": 0,
        "start_time": None,
        "end_time": None,
        "time_limit_s": None,
        "num_nodes": 1,
        "num_cpus": 1,
        "num_gpus": 2,
        "node_list": "",
        "restart_count": 0,
        "workdir": "/home/alice",
        "reason": "None",
        "req_nodes": fields.get("num_nodes", 1),
        "req_cpus": 1,
        "req_gpus": 2 * fields.get("num_nodes", 1),
    }
    return AcctJob(**{**base, **fields})


def batch(node: str, state: str, start: int, end: int | None, exit_code: int = 0, gpus: int = 2) -> AcctStep:
    return AcctStep(
        step="batch",
        name="batch",
        state=state,
        exit_code=exit_code,
        signal=0,
        start_time=T0 + start,
        end_time=None if end is None else T0 + end,
        node_list=node,
        num_cpus=4,
        num_tasks=1,
        num_gpus=gpus,
    )


def ran(start: int, end: int | None, nodes: str = "gpu01", n: int = 1) -> dict[str, Any]:
    times = {"start_time": T0 + start, "end_time": None if end is None else T0 + end}
    return {
        **times,
        "time_limit_s": 600,
        "node_list": nodes,
        "num_nodes": n,
        "num_cpus": 4 * n,
        "num_gpus": 2 * n,
    }


EXPECTED = [
    job(1, "COMPLETED", submit_time=T0 + 3, **ran(4, 7), steps=[batch("gpu01", "COMPLETED", 4, 6)]),
    job(
        2,
        "FAILED",
        submit_time=T0 + 8,
        exit_code=3,
        reason="NonZeroExitCode",
        **ran(9, 11, "gpu02"),
        steps=[batch("gpu02", "FAILED", 9, 10, exit_code=3)],
    ),
    job(3, "CANCELLED", submit_time=T0 + 12, end_time=T0 + 14, cancelled_by="alice"),  # 0:0, as Slurm
    job(
        4,
        "RUNNING",
        submit_time=T0 + 15,
        restart_count=1,
        **ran(20, None, "gpu[01-02]", 2),
        steps=[batch("gpu01", "RUNNING", 20, None)],
    ),
    job(5, "PENDING", user="bob", name="eval", submit_time=T0 + 22),
]


async def acct(rig: Rig, request: bytes, user: str = "alice") -> AcctReply | ApiError:
    nc = await connect(rig.creds(user), name=f"sacct-{user}")
    try:
        reply = await nc.request(subjects.api_subject("acct", user), request, timeout=10)
    finally:
        await nc.close()
    return msgspec.json.decode(reply.data, type=AcctReply | ApiError)


async def test_projection_rows_and_sacct_reply(rig: Rig) -> None:
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    assert await acct(rig, encode(AcctRequest())) == AcctReply(jobs=EXPECTED)
    steps = await rig.sql("SELECT job_id, attempt, state, end_time FROM steps WHERE job_id = 4")
    # Each attempt keeps its batch step; sacct shows the latest attempt's (EXPECTED), -D each under its own.
    assert steps == [(4, 0, "REQUEUED", T0 + 18), (4, 1, "RUNNING", None)]
    assert await rig.sql("SELECT epoch FROM scheduler_epoch") == [(2,)]


@pytest.mark.parametrize(
    ("request_", "jobs"),
    [
        (AcctRequest(users=["bob"]), [5]),
        (AcctRequest(states=["RUNNING", "PENDING"]), [4, 5]),
        (AcctRequest(job_ids=[2, 3, 99]), [2, 3]),
        (AcctRequest(start_after=T0 + 10), [2, 3, 4, 5]),
        (AcctRequest(end_before=T0 + 8), [1, 2]),
        (AcctRequest(limit=2), [1, 2]),
    ],
    ids=["user", "states", "job-ids", "start-after", "end-before", "limit"],
)
async def test_sacct_filters(rig: Rig, request_: AcctRequest, jobs: list[int]) -> None:
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    reply = await acct(rig, encode(request_))
    assert isinstance(reply, AcctReply)
    assert [j.job_id for j in reply.jobs] == jobs


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (b'{"type": "acct", "limit": "many"}', "limit"),
        (b'{"type": "acct", "job_ids": [1, "x"]}', "job_ids[1]"),
        (b'{"type": "acct", "states": ["DONE"]}', "states"),
        (b'{"type": "acct", "limit": 0}', "limit"),
        (b"not json", None),
    ],
    ids=["wrong-type", "bad-item", "unknown-state", "limit-out-of-range", "not-json"],
)
async def test_malformed_request_gets_an_error_naming_the_field(
    rig: Rig, request_: bytes, field: str | None
) -> None:
    await rig.start()
    await rig.caught_up()  # the API is served before the consumer exists
    reply = await acct(rig, request_)
    assert isinstance(reply, ApiError)
    assert (reply.code, reply.field) == ("invalid", field)
    # The service is still there.
    assert await acct(rig, encode(AcctRequest())) == AcctReply(jobs=[])


async def test_sacct_reads_a_long_history_page_by_page(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    # One reply of 10,000 jobs is ~10 MB of JSON, over NATS's max_payload: the verb answers in pages by job
    # id (PAGE_JOBS rows, MAX_REPLY_BYTES of JSON), and the commands' client reads them up to the limit.
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    monkeypatch.setattr(query, "PAGE_JOBS", 2)
    first = await acct(rig, encode(AcctRequest()))
    assert isinstance(first, AcctReply) and ([j.job_id for j in first.jobs], first.more) == ([1, 2], True)
    client = Cluster(url=rig.creds("alice").url, credentials=rig.creds("alice"))
    assert await asyncio.to_thread(client.acct, AcctRequest()) == EXPECTED
    assert await asyncio.to_thread(client.acct, AcctRequest(limit=3)) == EXPECTED[:3]
    assert await asyncio.to_thread(client.acct, AcctRequest(limit=2)) == EXPECTED[:2]
    # sacct reads every record, whatever the limit of one request (it showed the first 10,000 of 20,000).
    for limit in (1, 2, 3, 10_000):
        assert await asyncio.to_thread(client.acct, AcctRequest(limit=limit), True) == EXPECTED
    # The byte bound cuts a page as well, after one job at least.
    monkeypatch.setattr(query, "PAGE_JOBS", 5_000)
    monkeypatch.setattr(query, "MAX_REPLY_BYTES", 10)
    one = await acct(rig, encode(AcctRequest(after_job_id=3)))
    assert isinstance(one, AcctReply) and ([j.job_id for j in one.jobs], one.more) == ([4], True)
    assert await asyncio.to_thread(client.acct, AcctRequest()) == EXPECTED
    refused = await acct(rig, encode(AcctRequest(after_job_id=-1)))
    assert isinstance(refused, ApiError) and refused.field == "after_job_id"


async def test_entries_that_trickle_in_are_projected_together(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # While jobs flow the log's entries come one by one, and each had a transaction of its own. A fetch that
    # was not full is followed by none for GATHER_S (0.1 s; 1 s here, so that a loaded machine's pauses
    # between the appends below cannot split them further): the entries of that time are committed together.
    monkeypatch.setattr(partition, "GATHER_S", 1.0)
    await rig.start()
    await rig.caught_up()
    commits: list[int] = []
    save = sql.save_position

    async def counted(conn: Any, consumer: str, position: int) -> None:
        commits.append(position)
        await save(conn, consumer, position)

    monkeypatch.setattr(sql, "save_position", counted)
    for job_id in range(1, 11):  # ten submissions, 20 ms apart: 0.2 s
        await rig.append(submitted(job_id, name=f"t{job_id}"))
        await asyncio.sleep(0.02)
    await rig.caught_up()
    assert len(commits) <= 5, commits
    reply = await acct(rig, encode(AcctRequest()))
    assert isinstance(reply, AcctReply) and [j.job_id for j in reply.jobs] == list(range(1, 11))


async def test_redelivery_changes_nothing(rig: Rig) -> None:
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    before = await rig.dump()
    await rig.stop()
    # A new consumer delivers the whole log again; the stored position skips all of it.
    await rig.bus.js.delete_consumer(subjects.EVENTS_STREAM, CONSUMER)
    await rig.start()
    await rig.caught_up()
    assert await rig.dump() == before


async def test_projection_applied_twice_gives_identical_tables(rig: Rig) -> None:
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    before = await rig.dump()
    await rig.stop()
    # Without the position, every entry is applied again onto the finished rows.
    await rig.execute("UPDATE consumer_positions SET last_seq = 0")
    await rig.start()
    await rig.caught_up()
    assert await rig.dump() == before


async def test_dropping_the_tables_and_replaying_rebuilds_them(rig: Rig) -> None:
    await rig.append(*SCENARIO[:12])
    await rig.start()
    await rig.caught_up()
    await rig.append(*SCENARIO[12:])  # applied in a second batch, while running
    await rig.caught_up()
    before = await rig.dump()
    await rig.stop()
    await rig.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    await rig.start()
    await rig.caught_up()
    assert await rig.dump() == before


async def test_malformed_event_is_dead_lettered_and_the_rest_applied(rig: Rig) -> None:
    await rig.append(submitted(1))
    await rig.bus.js.publish(subjects.job_subject(999, "job_submitted"), b"\x00garbage")
    await rig.append(submitted(2, name="bad\x00name"), submitted(3))  # text PostgreSQL cannot store
    await rig.start()
    await rig.caught_up()
    assert await rig.sql("SELECT job_id FROM jobs ORDER BY job_id") == [(1,), (3,)]
    dlq = rig.bus.js
    garbage = await dlq.get_msg(subjects.DLQ_STREAM, seq=1)
    unstorable = await dlq.get_msg(subjects.DLQ_STREAM, seq=2)
    assert garbage.subject == unstorable.subject == subjects.dlq_subject("accounting")
    assert garbage.data == b"\x00garbage"
    assert garbage.headers is not None and "not a valid event" in garbage.headers["Corral-Reason"]
    assert unstorable.headers is not None and "cannot be stored" in unstorable.headers["Corral-Reason"]
    with pytest.raises(NotFoundError):
        await dlq.get_msg(subjects.DLQ_STREAM, seq=3)


async def test_events_after_start_are_applied_live(rig: Rig) -> None:
    await rig.start()
    # (The node registers first: the fold, and so accounting, allocates only on a registered node.)
    await rig.append(ev.NodeRegistered(node=ev.NodeName("gpu01"), cpus=32, mem_mb=65536, gpus=8))
    await rig.append(submitted(1))
    await rig.caught_up()
    await rig.append(allocated(1, 0, ["gpu01"]), exited(1, 0, "gpu01", 0))
    await rig.caught_up()
    assert await rig.sql("SELECT state, restart_count FROM jobs") == [("RUNNING", 0)]
    assert await rig.sql("SELECT state, end_time FROM steps") == [("COMPLETED", T0 + 4)]


async def test_migrations_apply_once_even_when_run_concurrently(rig: Rig) -> None:
    pools = [await store.create_pool(rig.dsn, min_size=1, max_size=1) for _ in range(3)]
    try:
        applied = await asyncio.gather(*(store.migrate(pool, sql.migrations()) for pool in pools))
        again = await store.migrate(pools[0], sql.migrations())
    finally:
        for pool in pools:
            await pool.close()
    assert sorted(applied) == [[], [], [1, 2, 3, 4, 5, 6]]
    assert again == []
    assert await rig.sql("SELECT version, name FROM schema_migrations ORDER BY version") == [
        (1, "accounting"),
        (2, "arrays"),
        (3, "qos"),
        (4, "attempts"),
        (5, "attempt_steps"),
        (6, "partitions"),
    ]


async def test_an_edited_migration_is_refused(rig: Rig) -> None:
    pool = await store.create_pool(rig.dsn)
    try:
        await store.migrate(pool, sql.migrations())
        original = sql.migrations()[0]
        edited = store.Migration(original.version, original.name, original.sql + "\n", "other")
        with pytest.raises(store.StoreError, match="edited"):
            await store.migrate(pool, [edited])
    finally:
        await pool.close()


def array_submitted(job: int, indices: str) -> ev.JobSubmitted:
    spec = ev.JobSpec(name="sweep", script="#!/bin/sh\n", workdir="/home/alice", array=parse_array(indices))
    return ev.JobSubmitted(job_id=ev.JobId(job), user="alice", spec=spec)


#: An array 10-13 (indices 0-3): task 0 completes, task 1 runs, then the whole array is cancelled;
#: a second array whose block overlaps the first is refused, as in the fold.
ARRAY_SCENARIO: list[ev.Event] = [
    ev.NodeRegistered(node=ev.NodeName("gpu01"), cpus=32, mem_mb=65536, gpus=8),
    array_submitted(10, "0-3%2"),
    allocated(10, 0, ["gpu01"]),
    allocated(11, 0, ["gpu01"], gpus=(2, 3)),
    exited(10, 0, "gpu01", 0),
    ev.JobCompleted(job_id=ev.JobId(10), attempt=0),
    ev.JobCancelRequested(job_id=ev.JobId(10), user="alice", whole_array=True),
    ev.JobCancelled(job_id=ev.JobId(12), attempt=-1, by="alice"),
    allocated(13, 0, ["gpu01"]),  # void: its cancel was requested
    array_submitted(13, "0-1"),  # void: job 13 exists
    submitted(15),
]


async def test_array_tasks_are_rows_of_their_own(rig: Rig) -> None:
    await rig.append(*ARRAY_SCENARIO)
    await rig.start()
    await rig.caught_up()
    rows = await rig.sql(
        "SELECT job_id, array_job_id, array_task_id, state, cancel_requested_by FROM jobs ORDER BY job_id"
    )
    assert rows == [
        (10, 10, 0, "COMPLETED", None),
        (11, 10, 1, "RUNNING", "alice"),
        (12, 10, 2, "CANCELLED", "alice"),
        (13, 10, 3, "PENDING", "alice"),
        (15, None, None, "PENDING", None),
    ]
    reply = await acct(rig, encode(AcctRequest(job_ids=[10])))
    assert isinstance(reply, AcctReply)
    assert [(j.job_id, j.array_job_id, j.array_task_id) for j in reply.jobs] == [
        (10, 10, 0),
        (11, 10, 1),
        (12, 10, 2),
        (13, 10, 3),
    ]
    reply = await acct(rig, encode(AcctRequest(job_ids=[12, 15])))
    assert isinstance(reply, AcctReply)
    assert [j.job_id for j in reply.jobs] == [12, 15]
    # Replaying onto the finished rows changes nothing.
    before = await rig.dump()
    await rig.stop()
    await rig.execute("UPDATE consumer_positions SET last_seq = 0")
    await rig.start()
    await rig.caught_up()
    assert await rig.dump() == before


#: QOS as the submission carries it; scontrol update of pending jobs (limit, partition, and back to the
#: default partition); an update after the start is ignored, as in the fold.
UPDATE_SCENARIO: list[ev.Event] = [
    ev.NodeRegistered(node=ev.NodeName("gpu01"), cpus=32, mem_mb=65536, gpus=8),
    submitted(20, qos="scavenger"),
    ev.JobUpdated(job_id=ev.JobId(20), by="root", time_limit_s=300, partition="debug"),
    submitted(21, qos="high"),
    ev.JobUpdated(job_id=ev.JobId(21), by="root", time_limit_s=900, partition="debug"),
    ev.JobUpdated(job_id=ev.JobId(21), by="root", time_limit_s=1200, partition=None, priority=7),
    allocated(21, 0, ["gpu01"]),
    ev.JobUpdated(job_id=ev.JobId(21), by="root", time_limit_s=60, partition="debug"),  # running: ignored
    submitted(22),
]


async def test_qos_and_scontrol_updates_are_projected(rig: Rig) -> None:
    await rig.append(*UPDATE_SCENARIO)
    await rig.start()
    await rig.caught_up()
    reply = await acct(rig, encode(AcctRequest(job_ids=[20, 21, 22])))
    assert isinstance(reply, AcctReply)
    assert [(j.job_id, j.state, j.partition, j.time_limit_s, j.qos) for j in reply.jobs] == [
        (20, "PENDING", "debug", 300, "scavenger"),
        (21, "RUNNING", "gpu", 600, "high"),
        (22, "PENDING", "gpu", None, ""),
    ]
    rows = await rig.sql("SELECT job_id, time_limit_s, partition FROM jobs WHERE job_id = 21")
    assert rows == [(21, 600, "gpu")]
    # Replaying onto the rows changes nothing.
    before = await rig.dump()
    await rig.stop()
    await rig.execute("UPDATE consumer_positions SET last_seq = 0")
    await rig.start()
    await rig.caught_up()
    assert await rig.dump() == before


async def call(rig: Rig, verb: str, request: Any, reply_type: Any, user: str = "alice") -> Any:
    nc = await connect(rig.creds(user), name=f"{verb}-{user}")
    try:
        reply = await nc.request(subjects.api_subject(verb, user), encode(request), timeout=10)
    finally:
        await nc.close()
    return msgspec.json.decode(reply.data, type=reply_type | ApiError)


async def test_every_attempt_is_kept_and_shown_with_duplicates(rig: Rig) -> None:
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    plain = await call(rig, "acct", AcctRequest(job_ids=[4]), AcctReply)
    assert plain.jobs[0].attempts == []
    reply = await call(rig, "acct", AcctRequest(job_ids=[4], duplicates=True), AcctReply)
    assert reply.jobs[0].attempts == [
        AcctAttempt(
            attempt=0, state="NODE_FAIL", partition="gpu", start_time=T0 + 16, end_time=T0 + 18,
            node_list="gpu[01-02]", num_nodes=2, num_cpus=8, num_gpus=4, mem_mb=0, exit_code=0, signal=0,
            reason="NodeFail", steps=[batch("gpu01", "REQUEUED", 16, 18)],
        )
    ]  # fmt: skip
    assert reply.jobs[0].steps == plain.jobs[0].steps  # the running attempt's
    assert await rig.sql(
        "SELECT job_id, attempt, state, end_time FROM attempts ORDER BY job_id, attempt"
    ) == [
        (1, 0, "COMPLETED", T0 + 7),
        (2, 0, "FAILED", T0 + 11),
        (4, 0, "NODE_FAIL", T0 + 18),
        (4, 1, "RUNNING", None),
    ]


async def test_report_sums_gpu_seconds_by_account_and_user_and_the_nodes_capacity(rig: Rig) -> None:
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    request = ReportRequest(start=T0, end=T0 + 30, tres=["gres/gpu", "cpu"])
    reply = await call(rig, "report", request, ReportReply)
    # GPUs x seconds in [T0, T0+30): job 1 2x3, job 2 2x2, job 4's first run 4x2, its second 4x10 (clipped).
    assert reply.usage == [
        TresUsage(tres="gres/gpu", account="", user="alice", seconds=58),
        TresUsage(tres="cpu", account="", user="alice", seconds=12 + 8 + 16 + 80),
    ]
    # AccountUtilizationByUser's rows: root, the account (under root: not configured), its user.
    assert [(a.account, a.user, a.depth, a.seconds) for a in reply.accounts] == [
        ("root", "", 0, [58, 116]),
        ("", "", 1, [58, 116]),
        ("", "alice", 2, [58, 116]),
    ]
    # gpu01 from T0+1, gpu02 from T0+2, down from T0+17 to T0+19.
    assert reply.capacity == [
        TresCapacity(tres="gres/gpu", allocated=58, down=16, reported=8 * 29 + 8 * 28),
        TresCapacity(tres="cpu", allocated=116, down=64, reported=32 * 29 + 32 * 28),
    ]
    bad = await call(rig, "report", ReportRequest(start=T0, end=T0), ReportReply)
    assert isinstance(bad, ApiError) and bad.field == "end"


async def test_the_attempts_migration_rebuilds_an_older_database_from_the_log(rig: Rig) -> None:
    await rig.append(*SCENARIO)
    await rig.start()
    await rig.caught_up()
    expected = await rig.dump()
    await rig.stop()
    # The database as the release before 004 left it: its tables, rows and position, no attempts.
    await rig.execute(
        "DROP TABLE attempts, node_periods; DELETE FROM schema_migrations WHERE version = 4;"
        " ALTER TABLE jobs DROP COLUMN req_nodes, DROP COLUMN req_cpus, DROP COLUMN req_gpus,"
        " DROP COLUMN req_mem_mb, DROP COLUMN gpu_type, DROP COLUMN alloc_mem_mb"
    )
    await rig.start()  # migrates (emptying the tables and the position), then replays the whole log

    async def migrated() -> bool:
        return await rig.sql("SELECT 1 FROM schema_migrations WHERE version = 4") == [(1,)]

    await rig.until(migrated, "004 is applied")
    await rig.caught_up()
    assert await rig.dump() == expected
