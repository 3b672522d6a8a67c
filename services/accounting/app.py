"""The accounting service (slurmdbd): the log projected into PostgreSQL, and the sacct and sreport API."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from opentelemetry.trace import SpanKind

from corral.libs.runtime import store, telemetry
from corral.libs.runtime.api_server import serve
from corral.libs.runtime.bus import Bus, LogEntry, entry_of
from corral.libs.runtime.errors import CorralError, InvalidInput, TransientError
from corral.libs.runtime.service import Context
from corral.libs.runtime.telemetry import logger
from corral.schemas import subjects
from corral.schemas.api import AcctReply, AcctRequest, ReportReply, ReportRequest
from corral.services.accounting import query, report, sql
from corral.services.accounting.folded import Projector
from corral.services.accounting.projection import Batch, plan_batch

#: Name of the durable JetStream consumer, of the position row and of the dead-letter subject.
CONSUMER = "accounting"
#: Seconds between attempts to reach the database at start.
RETRY_S = 2.0

_Reply = TypeVar("_Reply")


_tracer = telemetry.tracer(__name__)


class AccountingService:
    """Projects the log into the ``jobs``/``steps`` tables and answers sacct requests.

    The projection cycle, once per delivered batch of log entries:

    1. fetch: ``Bus.consume`` hands over a batch from the durable consumer ``accounting``;
    2. plan: decode the entries and, against the stored position, keep those next in log order
       (``plan_batch``: redelivered entries are skipped, entries after a missing one wait);
    3. fold and convert: fold them into the scheduler's state kept here, and turn those the fold applied
       into row operations (``folded.Projector``, pure; at start, and if another consumer moved the
       position, the log is folded up to the stored position first);
    4. commit: one transaction applies the operations and moves the stored position;
    5. ack: the bus acks the batch, naks it on ``TransientError`` (database down, an earlier
       entry still missing) or dead-letters an entry on ``InvalidInput`` (undecodable, or a
       value the database refuses).

    Beside the cycle it answers ``corral.api.v1.acct.<user>`` (sacct) and ``corral.api.v1.report.<user>``
    (sreport) in the queue group ``accounting``.
    """

    def __init__(
        self,
        bus: Bus,
        pool: store.Pool,
        *,
        default_partition: str = "",
        consumer: str = CONSUMER,
        cluster: str = "",
        clock: Callable[[], float] = time.time,
        parents: Mapping[str, str] | None = None,
    ):
        self.bus = bus
        self.pool = pool
        self.cluster = cluster  # the cluster's name, as sreport prints it
        self.clock = clock  # where a running job's or an up node's time ends in a report
        self.parents = dict(parents or {})  # each configured account's parent: sreport's account tree
        self.default_partition = default_partition
        self.consumer = consumer
        self.log = logger(consumer=consumer)
        self.projector = Projector(default_partition)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve the API and project the log until ``stop`` is set."""
        await self.rewind_if_behind()
        sub = await serve(self.bus.nc, "acct", AcctRequest, self.acct, queue=CONSUMER)
        report_sub = await serve(self.bus.nc, "report", ReportRequest, self.report, queue=CONSUMER)
        try:
            while not stop.is_set():
                try:
                    await self.bus.consume(
                        subjects.EVENTS_STREAM,
                        self.consumer,
                        subjects.EVENTS_SUBJECTS,
                        self.handle,
                        service=CONSUMER,
                        stop=stop,
                    )
                except TimeoutError:
                    # nats-py's fetch can raise the builtin TimeoutError, which Bus.consume does not
                    # treat as "no messages yet"; consuming again resumes from the durable consumer.
                    self.log.warning("fetch timed out; consuming again")
        finally:
            await report_sub.unsubscribe()
            await sub.unsubscribe()

    async def rewind_if_behind(self) -> None:
        """Restart the JetStream consumer from the beginning if the database is behind its acks.

        That happens when the database was dropped or restored from a backup: the log is then
        replayed, and the entries the database already has are skipped by their position.
        """
        async with self.pool.acquire() as conn:
            position = await sql.read_position(conn, self.consumer)
        try:
            info = await self.bus.js.consumer_info(subjects.EVENTS_STREAM, self.consumer)
        except NotFoundError:
            return
        acked = int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0
        if acked > position:
            self.log.warning("database behind the log consumer: replaying", position=position, acked=acked)
            await self.bus.js.delete_consumer(subjects.EVENTS_STREAM, self.consumer)

    async def handle(self, msgs: list[Msg]) -> None:
        """Steps 2-4 for one batch; the bus does step 5 from the outcome."""
        delivered = [entry_of(msg) for msg in msgs]
        try:
            batch = await self.commit(delivered)
        except Exception as exc:
            raise await self._failure(exc, delivered) from exc
        if batch.rejected:
            bad = next(entry for entry in delivered if entry.seq == batch.rejected[0])
            raise InvalidInput(f"log entry {bad.seq} on {bad.subject} is not a valid event: {bad.error}")
        if batch.waiting_for is not None:
            raise TransientError(f"log entry {batch.waiting_for} must be applied first")

    async def commit(self, delivered: list[LogEntry]) -> Batch:
        """Plan, fold, convert and apply one delivery in one transaction with the position.

        The transaction is a short live span, a root of its own (a delivery is about many jobs), linked to
        the traces of the jobs whose entries it applies (``telemetry.links``)."""
        traces = telemetry.links(e.envelope.meta.traceparent for e in delivered if e.envelope is not None)
        with _tracer.start_as_current_span(
            "accounting transaction",
            context=telemetry.extract(None),
            kind=SpanKind.CLIENT,
            links=traces,
            attributes={
                "db.system": "postgresql",
                "db.operation.name": "projection transaction",
                "corral.log.first_seq": delivered[0].seq if delivered else 0,
                "corral.log.entries": len(delivered),
            },
        ):
            async with self.pool.acquire() as conn, conn.transaction():
                position = await sql.lock_position(conn, self.consumer)
                batch = plan_batch([(entry.seq, entry.envelope) for entry in delivered], position)
                await self.fold_to(position)
                await sql.apply_ops(conn, self.projector.operations(batch.entries))
                await sql.save_position(conn, self.consumer, batch.position)
        self.projector.committed(batch.position)
        self._report_skipped()
        return batch

    async def fold_to(self, position: int) -> None:
        """Bring the fold's state to the stored ``position`` (from the log), unless it is there already."""
        if self.projector.covers(position):
            return
        if self.projector.state.last_seq > position:
            # Ahead of the database by entries whose operations are gone: fold again from the start.
            self.projector = Projector(self.default_partition)
        entries = self.bus.read(self.projector.state.last_seq + 1)
        try:
            async for entry in entries:
                if entry.seq > position:
                    break
                self.projector.fold_only(entry.seq, entry.envelope)
                if entry.seq == position:
                    break
        finally:
            await entries.aclose()
        self.projector.committed(position)
        self._report_skipped()

    def _report_skipped(self) -> None:
        """Log the entries the fold skipped (a handler failed on them; the scheduler dead-letters them)."""
        for seq, error in self.projector.skipped:
            self.log.warning("the fold skipped a log entry", seq=seq, error=error)
        self.projector.skipped = []

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

    async def _failure(self, exc: Exception, delivered: list[LogEntry]) -> CorralError:
        """The error that tells the bus what to do after a failed commit."""
        if store.is_bad_data(exc):
            if len(delivered) > 1:
                # The bus retries the batch one entry at a time, so only the culprit is rejected.
                return InvalidInput(f"a value of this batch cannot be stored: {exc}")
            seq = delivered[0].seq
            try:
                skipped = await self._skip(seq)
            except Exception as skip_exc:
                return TransientError(f"cannot skip log entry {seq}: {skip_exc!r}")
            if not skipped:
                return TransientError(f"log entry {seq} is not the next one; retrying")
            self.log.warning("log entry cannot be stored", seq=seq, error=str(exc))
            return InvalidInput(f"log entry {seq} cannot be stored: {exc}")
        if not store.is_transient(exc):
            # Most likely a bug here: retry (and stall visibly) rather than dead-letter the whole log.
            self.log.error("projection failed", exc_info=exc)
        return TransientError(f"projection failed: {exc!r}")

    async def _skip(self, seq: int) -> bool:
        """Move the position past entry ``seq`` without applying it, if it is the next one."""
        async with self.pool.acquire() as conn, conn.transaction():
            if await sql.lock_position(conn, self.consumer) != seq - 1:
                return False
            await sql.save_position(conn, self.consumer, seq)
        self.projector.committed(seq)
        return True


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
    try:
        service = AccountingService(
            ctx.bus,
            pool,
            default_partition=ctx.config.default_partition.name if partitions else "",
            cluster=ctx.config.name,
            parents={a.name: a.parent for a in ctx.config.accounts},
        )
        await service.run(ctx.stop)
    finally:
        await pool.close()
