"""One partition of the accounting projection: its durable consumer, its position row, its share of the rows.

The cycle, once per delivered batch of log entries:

1. fetch: ``Bus.consume`` hands over a batch from the partition's durable consumer (``partition_name``:
   ``accounting`` with one partition, ``accounting-p<k>of<P>`` otherwise); every partition reads the
   whole log; no sooner than ``GATHER_S`` after the last fetch unless that one came full (``Gathered``):
   while jobs flow the entries trickle in, and each had a transaction of its own; ``sacct`` may show a job
   a tenth of a second later;
2. plan: decode the entries and, against the partition's stored position, keep those next in log order
   (``plan_batch``: redelivered entries are skipped, entries after a missing one wait);
3. fold and convert: fold them into the scheduler's state kept here, turn those the fold applied into row
   operations (``folded.Projector``, pure; at start, and if another holder moved the position, the log is
   folded up to the stored position first), and keep the partition's own (``owners.share``);
4. commit: one transaction applies the operations and moves the partition's position;
5. ack: the bus acks the batch, naks it on ``TransientError`` (database down, an earlier entry still
   missing) or dead-letters an entry on ``InvalidInput`` (undecodable: by partition 0 only, the others
   step over it; or a value the database refuses: by the partition whose row it is).

Before the cycle starts (``align``) the consumer is put where the database is: recreated at the stored
position if the database is behind its acks (dropped, restored from a backup) or if it has deliveries
nobody acknowledged (those of a holder that died, which JetStream would redeliver only after its ack wait).
Only the partition's lease holder consumes it, so nobody else is using the consumer then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from opentelemetry.trace import SpanKind

from corral.libs.core.partition_claims import partition_name
from corral.libs.runtime import store, telemetry
from corral.libs.runtime.bus import Bus, LogEntry, entry_of
from corral.libs.runtime.errors import CorralError, InvalidInput, TransientError
from corral.libs.runtime.pacing import Gathered
from corral.libs.runtime.telemetry import logger
from corral.schemas import subjects
from corral.services.accounting import owners, sql
from corral.services.accounting.folded import Projector
from corral.services.accounting.projection import Batch, plan_batch

#: Entries per fetch, and the shortest time between two fetches that were not full (step 1).
BATCH = 256
GATHER_S = 0.1
#: Seconds between attempts to reach the database.
RETRY_S = 2.0
#: The service name of the dead-letter subject (``corral.dlq.accounting``), whatever the partition.
SERVICE = "accounting"

_tracer = telemetry.tracer(__name__)


class Partition:
    """Partition ``k`` of ``partitions`` of the projection, as one process runs it while holding it."""

    def __init__(
        self,
        bus: Bus,
        pool: store.Pool,
        k: int = 0,
        partitions: int = 1,
        default_partition: str = "",
        min_job_age_s: float = 0.0,
    ) -> None:
        self.bus = bus
        self.pool = pool
        self.k, self.partitions = k, partitions
        self.name = partition_name(k, partitions)  # its durable consumer and position row
        self.default_partition = default_partition  # the cluster's default (Slurm) partition
        self.min_job_age_s = min_job_age_s  # when the fold forgets an ended job (the scheduler's MinJobAge)
        self.projector = Projector(default_partition, min_job_age_s)
        self.applied: Counter[str] = Counter()  # the operations this process applied, by type (a gauge of
        # the share of the work; an operation counts once per commit, even when it changed no row)
        self.log = logger(consumer=self.name)
        self.pace = Gathered(GATHER_S, BATCH)  # step 1's wait

    async def run(self, stop: asyncio.Event) -> None:
        """Align the consumer, then project until ``stop`` is set."""
        position = await self._aligned(stop)
        while not stop.is_set():
            try:
                await self.bus.consume(
                    subjects.EVENTS_STREAM,
                    self.name,
                    subjects.EVENTS_SUBJECTS,
                    self.handle,
                    service=SERVICE,
                    batch=BATCH,
                    stop=stop,
                    pause=self.pace,
                    start_seq=position + 1,
                )
            except TimeoutError:
                # nats-py's fetch can raise the builtin TimeoutError, which Bus.consume does not
                # treat as "no messages yet"; consuming again resumes from the durable consumer.
                self.log.warning("fetch timed out; consuming again")

    async def _aligned(self, stop: asyncio.Event) -> int:
        """``align``, retried while the database is unreachable (the position; 0 if stopped first)."""
        while True:
            try:
                return await self.align()
            except Exception as exc:
                if not store.is_transient(exc):
                    raise
                self.log.warning("database unreachable; retrying", error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=RETRY_S)
            if stop.is_set():
                return 0

    async def align(self) -> int:
        """Recreate the consumer at the stored position if it is not where the database is; the position."""
        async with self.pool.acquire() as conn:
            position = await sql.read_position(conn, self.name)
        try:
            info = await self.bus.js.consumer_info(subjects.EVENTS_STREAM, self.name)
        except NotFoundError:
            return position
        acked = int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0
        if acked > position or info.num_ack_pending:
            self.log.warning(
                "consumer not where the database is: restarting it there",
                position=position,
                acked=acked,
                unacknowledged=info.num_ack_pending,
            )
            await self.bus.js.delete_consumer(subjects.EVENTS_STREAM, self.name)
        return position

    async def handle(self, msgs: list[Msg]) -> None:
        """Steps 2-4 for one batch; the bus does step 5 from the outcome."""
        delivered = [entry_of(msg) for msg in msgs]
        try:
            batch = await self.commit(delivered)
        except Exception as exc:
            raise await self._failure(exc, delivered) from exc
        if batch.rejected and self.k == 0:
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
                "corral.accounting.partition": self.name,
            },
        ):
            async with self.pool.acquire() as conn, conn.transaction():
                position = await sql.lock_position(conn, self.name, self.partitions)
                batch = plan_batch([(entry.seq, entry.envelope) for entry in delivered], position)
                await self.fold_to(position)
                ops = owners.share(self.projector.operations(batch.entries), self.k, self.partitions)
                await sql.apply_ops(conn, ops)
                await sql.save_position(conn, self.name, batch.position)
        self.applied.update(type(op).__name__ for op in ops)
        self.projector.committed(batch.position)
        self._report_skipped()
        return batch

    async def fold_to(self, position: int) -> None:
        """Bring the fold's state to the stored ``position`` (from the log), unless it is there already."""
        if self.projector.covers(position):
            return
        if self.projector.state.last_seq > position:
            # Ahead of the database by entries whose operations are gone: fold again from the start.
            self.projector = Projector(self.default_partition, self.min_job_age_s)
        entries = self.bus.read(self.projector.state.last_seq + 1)
        try:
            async for entry in entries:
                if entry.seq > position:
                    break
                self.projector.fold_only(entry.seq, entry.envelope, entry.subject)
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
            if await sql.lock_position(conn, self.name, self.partitions) != seq - 1:
                return False
            await sql.save_position(conn, self.name, seq)
        self.projector.committed(seq)
        return True
