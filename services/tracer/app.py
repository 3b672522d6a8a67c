"""The tracer: each job's phase spans, derived from the log, exported over OTLP when each phase ends.

A queue wait or a run may last weeks, so no process holds a phase's span open: the spans are a pure
projection of the log (``libs/trace/derive.py``) with deterministic ids, and this service exports each one
when it reads the entry that ends it. It runs only when an OTLP endpoint is configured, and may only read
the log (role ``corral-tracer``).
"""

from __future__ import annotations

import asyncio

from nats.aio.msg import Msg
from nats.js.errors import NotFoundError
from opentelemetry.sdk.trace.export import SpanExporter

from corral.libs.config import otlp
from corral.libs.runtime import telemetry
from corral.libs.runtime.bus import Bus, entry_of
from corral.libs.runtime.errors import InvalidInput
from corral.libs.runtime.pacing import Gathered
from corral.libs.runtime.service import Context
from corral.libs.runtime.telemetry import logger
from corral.schemas import subjects
from corral.services.tracer import otel
from corral.services.tracer.jobs import Jobs

#: Name of the durable JetStream consumer (``--consumer`` gives another: a second, independent pass).
CONSUMER = "tracer"
#: Entries per fetch. A full fetch is exported at once: the log is busier than a batch per delay, and
#: waiting would leave the tracer further behind at every batch.
BATCH = 256


class TracerService:
    """Exports the spans the log's entries end.

    The cycle:

    1. rebuild (at start): the log up to the consumer's acknowledged position is filed again
       (``jobs.Jobs``), exporting nothing: those spans were exported before the acks;
    2. fetch: ``Bus.consume`` hands a batch from the durable consumer, but no sooner than ``delay``
       seconds after the previous fetch (``OTEL_BSP_SCHEDULE_DELAY``, as the services' batch processors
       export): the tracer need not follow the log at once, and waking for each entry, deriving and
       exporting competed with the gateway, the scheduler and the agents for the cores at the moment they
       served that entry (a POST alone costs about 1 ms of CPU however few spans it carries). While it
       waits, the entries gather in the consumer and the next fetch takes them all; after a full fetch of
       ``BATCH`` entries it does not wait (the log is busier than that);
    3. derive: the batch's entries are filed under their jobs, then each job they touched is derived once,
       which gives the spans the batch ended;
    4. export: those spans go to the OTLP endpoint in one request, synchronously;
    5. ack: the bus acks the batch only then; a failed export naks it (``TransientError``) and the same
       entries, derived again, give the same spans.
    """

    def __init__(
        self, bus: Bus, exporter: SpanExporter, consumer: str = CONSUMER, delay: float = otlp.EXPORT_DELAY_S
    ) -> None:
        self.bus = bus
        self.exporter = exporter
        self.consumer = consumer
        self.delay = delay
        self.jobs = Jobs()
        self.log = logger(consumer=consumer)
        self._pause = Gathered(delay, BATCH)  # step 2's wait

    async def run(self, stop: asyncio.Event) -> None:
        """Rebuild, then consume the log until ``stop`` is set."""
        await self.rebuild()
        while not stop.is_set():
            try:
                await self.bus.consume(
                    subjects.EVENTS_STREAM,
                    self.consumer,
                    subjects.EVENTS_SUBJECTS,
                    self.handle,
                    service="tracer",
                    batch=BATCH,
                    stop=stop,
                    pause=self._pause,
                )
            except TimeoutError:
                self.log.warning("fetch timed out; consuming again")

    async def rebuild(self) -> None:
        """Step 1: file the entries the consumer acknowledged before (their spans are out)."""
        try:
            info = await self.bus.js.consumer_info(subjects.EVENTS_STREAM, self.consumer)
        except NotFoundError:
            return
        acked = int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0
        if acked == 0:
            return
        entries = self.bus.read(1)
        try:
            async for entry in entries:
                if entry.seq > acked:
                    break
                self.jobs.file(entry.seq, entry.envelope)
                if entry.seq % BATCH == 0:
                    self.jobs.take()
                    self.jobs.commit()
        finally:
            await entries.aclose()
        self.jobs.take()
        self.jobs.commit()
        self.jobs.position = max(self.jobs.position, acked)
        self.log.info("rebuilt from the log", position=acked, live_jobs=len(self.jobs.entries))

    async def handle(self, msgs: list[Msg]) -> None:
        """Steps 3-4 for one batch; the bus acks it (step 5) when this returns."""
        position = self.jobs.position
        for msg in msgs:
            entry = entry_of(msg)
            self.jobs.file(entry.seq, entry.envelope)
        spans = self.jobs.take()
        try:
            await asyncio.to_thread(otel.export, self.exporter, spans)
        except Exception:
            # Not exported: file these entries again when they are redelivered.
            self.jobs.rollback(position)
            raise
        self.jobs.commit()
        if spans:
            self.log.info("exported spans", count=len(spans), position=self.jobs.position)


async def main(ctx: Context) -> None:
    """The composition root: the OTLP target from the standard variables, then run."""
    target = otlp.target(ctx.settings)
    if target is None:
        raise InvalidInput(
            "the tracer exports spans over OTLP: set OTEL_EXPORTER_OTLP_ENDPOINT "
            "(or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)",
            field="OTEL_EXPORTER_OTLP_ENDPOINT",
        )
    delay = otlp.export_delay(ctx.settings)
    exporter = telemetry.span_exporter(target)
    try:
        await TracerService(ctx.bus, exporter, ctx.args.consumer, delay).run(ctx.stop)
    finally:
        exporter.shutdown()
