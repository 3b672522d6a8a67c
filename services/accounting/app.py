"""The accounting service (slurmdbd): the log projected into PostgreSQL, and the sacct and sreport API."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from corral.libs.core.lease import DEFAULT_TTL_S
from corral.libs.core.partition_claims import partition_name
from corral.libs.runtime import store
from corral.libs.runtime.api_server import serve
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import InvalidInput, TransientError
from corral.libs.runtime.service import Context
from corral.libs.runtime.telemetry import logger
from corral.schemas.api import AcctReply, AcctRequest, ReportReply, ReportRequest
from corral.services.accounting import query, report, sql
from corral.services.accounting.holding import PartitionHolder
from corral.services.accounting.partition import Partition

#: Operation types that write no job, attempt or step row (``applied``).
_NOT_JOB_ROWS = ("NodeChange", "RaiseEpoch")

#: Name of the durable JetStream consumer, of the position row and of the dead-letter subject with one
#: partition (the default); partition k of P is ``accounting-p<k>of<P>``.
CONSUMER = partition_name(0, 1)
#: Seconds between attempts to reach the database at start.
RETRY_S = 2.0

_Reply = TypeVar("_Reply")


class AccountingService:
    """Projects the log into the ``jobs``/``steps`` tables and answers sacct requests.

    The projection is ``partitions`` partitions by row owner (``owners.py``), each projected by its own
    cycle (``partition.Partition``: fetch, plan, fold and convert, keep its rows, commit, ack). Without a
    lease (``replica`` None: one process, as in tests) this process runs every partition; with one, it runs
    the partitions it holds (``holding.PartitionHolder``): its preferred one, ``replica % partitions``, and
    any whose holder died, handed back when their preferred process is alive again.

    Beside the cycle it answers ``corral.api.v1.acct.<user>`` (sacct) and ``corral.api.v1.report.<user>``
    (sreport) in the queue group ``accounting``: every process answers, whichever partitions it holds.
    """

    def __init__(
        self,
        bus: Bus,
        pool: store.Pool,
        *,
        default_partition: str = "",
        cluster: str = "",
        clock: Callable[[], float] = time.time,
        parents: Mapping[str, str] | None = None,
        partitions: int = 1,
        replica: int | None = None,
        name: str = CONSUMER,
        lease_ttl_s: float = DEFAULT_TTL_S,
        min_job_age_s: float = 0.0,
    ):
        self.bus = bus
        self.pool = pool
        self.cluster = cluster  # the cluster's name, as sreport prints it
        self.clock = clock  # where a running job's or an up node's time ends in a report
        self.parents = dict(parents or {})  # each configured account's parent: sreport's account tree
        self.partitions = [  # every partition of the projection, by k
            Partition(bus, pool, k, partitions, default_partition, min_job_age_s) for k in range(partitions)
        ]
        self.holder = (  # the partition leases (None: this process runs every partition)
            None
            if replica is None
            else PartitionHolder(bus.js, self.partitions, replica=replica, name=name, ttl_s=lease_ttl_s)
        )
        self.log = logger(service=CONSUMER)

    def applied(self) -> int:
        """How many operations on job, attempt and step rows this process applied (its share of the work)."""
        return sum(n for p in self.partitions for kind, n in p.applied.items() if kind not in _NOT_JOB_ROWS)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve the API and project the log (the partitions held) until ``stop`` is set."""
        sub = await serve(self.bus.nc, "acct", AcctRequest, self.acct, queue=CONSUMER)
        report_sub = await serve(self.bus.nc, "report", ReportRequest, self.report, queue=CONSUMER)
        try:
            if self.holder is not None:
                await self.holder.run(stop)
            else:
                await asyncio.gather(*(p.run(stop) for p in self.partitions))
        finally:
            await report_sub.unsubscribe()
            await sub.unsubscribe()

    async def acct(self, user: str, req: AcctRequest) -> AcctReply:
        """sacct for ``user`` (any user may read every job's record, as in Slurm's default)."""
        query.validate(req)
        return await self._read(lambda conn: query.acct(conn, req))

    async def report(self, user: str, req: ReportRequest) -> ReportReply:
        """sreport for ``user`` (any user may read the cluster's usage, as in Slurm's default)."""
        report.validate(req)
        now = self.clock()
        return await self._read(lambda conn: report.report(conn, req, now, self.cluster, self.parents))

    async def _read(self, answer: Callable[[store.Connection], Awaitable[_Reply]]) -> _Reply:
        """``answer`` on a pooled connection; TransientError while the database is unavailable."""
        try:
            async with self.pool.acquire() as conn:
                return await answer(conn)
        except Exception as exc:
            if store.is_transient(exc):
                raise TransientError("the accounting database is unavailable; try again") from exc
            raise


async def open_store(dsn: str, stop: asyncio.Event) -> store.Pool | None:
    """A pool on a migrated database, retrying while it is unreachable; None if stopped first."""
    log = logger()
    while not stop.is_set():
        pool = None
        try:
            pool = await store.create_pool(dsn)
            await store.migrate(pool, sql.migrations())
            return pool
        except Exception as exc:
            if pool is not None:
                await pool.close()
            if not store.is_transient(exc):
                raise
            log.warning("database unreachable; retrying", error=repr(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=RETRY_S)
    return None


async def main(ctx: Context) -> None:
    """The composition root: database from ``--database-url``/CORRAL_DATABASE_URL, then run."""
    dsn = ctx.args.database_url or ctx.settings.database_url
    if not dsn:
        raise InvalidInput("--database-url (or CORRAL_DATABASE_URL) is required", field="database_url")
    pool = await open_store(dsn, ctx.stop)
    if pool is None:
        return
    partitions = ctx.config.partitions
    shared = ctx.config.accounting
    try:
        service = AccountingService(
            ctx.bus,
            pool,
            default_partition=ctx.config.default_partition.name if partitions else "",
            cluster=ctx.config.name,
            parents={a.name: a.parent for a in ctx.config.accounts},
            partitions=shared.partitions,
            replica=ctx.args.replica,
            name=f"{socket.gethostname()}-{ctx.args.replica}",
            lease_ttl_s=shared.lease_ttl_s,
            min_job_age_s=float(ctx.config.scheduler.min_job_age_s),
        )
        await service.run(ctx.stop)
    finally:
        await pool.close()
