"""The JetStream bus: idempotent appends, ordered replay, consumers (the streams: ``streams.py``).

- ``append`` publishes one envelope with ``Nats-Msg-Id`` (retries are deduplicated by the server)
  and, when asked, ``Nats-Expected-Last-Subject-Sequence`` over a wildcard subject (optimistic
  concurrency per job: two writers cannot both win). An append with the job's ``traceparent`` is a
  short span (``append <tag>``) in the job's trace. Appends are asynchronous JetStream publishes: the
  concurrent appends of a process (a gateway's submissions) are pipelined on its connection, at most
  ``APPEND_IN_FLIGHT`` awaiting their acknowledgement (more wait for a slot), each for ``APPEND_TIMEOUT_S``.
- ``read`` replays the log in order from a sequence, with the decoded envelope or the decode
  error of each entry (a malformed entry never stops a reader); ``entries`` reads the entries of a few
  subjects at once (one job's or node's history) with the server doing the filtering (``log_entries.py``).
- ``consume`` runs a durable pull consumer: handler success -> ack, ``TransientError`` -> nak
  with delay, ``InvalidInput``/decode error -> term + a copy on the dead-letter subject;
- ``dead_letter_entry`` keeps a copy of a log entry a reader skipped (a poison entry), once.
- With a ``Metrics`` (``metrics.py``) it counts appends by event type and dead letters, and ``consume``
  records its durable consumer's lag every ``LAG_POLL_S``.

``Bus`` is the real adapter of the ``EventLog`` and ``JobIds`` ports (``ports.py``), ``NatsApi`` that of
``ApiClient`` (``nats_api.py``); their in-memory fakes are in ``memlog.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from corral.libs.runtime import log_entries, telemetry
from corral.libs.runtime.errors import AppendConflict, InvalidInput, TransientError
from corral.libs.runtime.id_blocks import GroupedIds
from corral.libs.runtime.job_ids import UNAVAILABLE, NatsJobIds
from corral.libs.runtime.last_entries import last_entries
from corral.libs.runtime.metrics import REJECTED, SKIPPED_ENTRY, Metrics
from corral.libs.runtime.nats_api import NatsApi as NatsApi  # re-exported: the services' ApiClient
from corral.libs.runtime.pipeline import Pipeline
from corral.libs.runtime.ports import Appended, decode_entry

# Re-exported: the services that read the log name its entries from here.
from corral.libs.runtime.ports import LogEntry as LogEntry
from corral.schemas import subjects
from corral.schemas.codec import encode, envelope
from corral.schemas.events import Envelope, Event

#: JetStream's error code for a failed expected-last-subject-sequence check.
_WRONG_LAST_SEQUENCE = 10071

_tracer = telemetry.tracer(__name__)

#: Seconds between two reads of a durable consumer's info for its lag metric.
LAG_POLL_S = 5.0
#: Seconds a consumer waits before fetching again while JetStream is unavailable (electing a leader).
UNAVAILABLE_PAUSE_S = 0.5


class Bus:
    """The log and the work queues, for one authenticated actor."""

    def __init__(self, nc: Client, actor: str, metrics: Metrics | None = None) -> None:
        self.nc = nc
        self.js = nc.jetstream(timeout=10.0)
        self.pipeline = Pipeline(nc)  # the appends, published asynchronously
        counter = NatsJobIds(self.js)
        # the job id counter, one compare-and-set for the demands of every concurrent submission
        self.job_ids = GroupedIds(counter.next_job_id, counter.last_job_id)
        self.actor = actor
        self.metrics = metrics  # counts appends, dead letters and consumer lag (None: no metrics)

    async def append(
        self,
        body: Event,
        *,
        msg_id: str | None = None,
        expect_last_seq: int | None = None,
        expect_subject: str | None = None,
        occurred_at: float | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        traceparent: str | None = None,
    ) -> Appended:
        """Append one event; AppendConflict if ``expect_last_seq`` is stale for ``expect_subject``."""
        env = envelope(
            body,
            actor=self.actor,
            occurred_at=occurred_at,
            correlation_id=correlation_id,
            causation_id=causation_id,
            traceparent=traceparent,
        )
        subject = subjects.event_subject(body)
        if traceparent is None:
            return await self._publish(env, subject, msg_id, expect_last_seq, expect_subject)
        tag = type(body).__struct_config__.tag
        # Not made current: nothing under it starts a span or logs (``telemetry.ended``: cheaper).
        span = _tracer.start_span(
            f"append {tag}",
            context=telemetry.extract(traceparent),
            attributes={"messaging.destination.name": subject, "corral.actor": self.actor},
        )
        try:
            appended = await self._publish(env, subject, msg_id, expect_last_seq, expect_subject)
        except BaseException as exc:
            telemetry.ended(span, exc)
            raise
        span.set_attribute("messaging.message.id", msg_id or env.meta.event_id)
        span.set_attribute("corral.log.seq", appended.seq)
        telemetry.ended(span, None)
        return appended

    async def _publish(
        self,
        env: Envelope,
        subject: str,
        msg_id: str | None,
        expect_last_seq: int | None,
        expect_subject: str | None,
    ) -> Appended:
        traceparent = env.meta.traceparent
        headers = {"Nats-Msg-Id": msg_id or env.meta.event_id}
        if traceparent:
            headers["traceparent"] = traceparent
        if expect_last_seq is not None:
            headers["Nats-Expected-Last-Subject-Sequence"] = str(expect_last_seq)
            if expect_subject is not None:
                headers["Nats-Expected-Last-Subject-Sequence-Subject"] = expect_subject
        try:
            ack = await self.pipeline.publish(subject, encode(env), headers)
        except APIError as exc:
            if exc.err_code == _WRONG_LAST_SEQUENCE:
                raise AppendConflict(expect_subject or subject, expect_last_seq or 0) from None
            raise TransientError(f"append to {subject} failed: {exc}") from exc
        except (TimeoutError, *UNAVAILABLE) as exc:
            # No acknowledgement: the entry may or may not be stored; a retry with its message id is safe.
            raise TransientError(f"append to {subject} failed: {exc!r}") from exc
        if self.metrics is not None and not ack.duplicate:
            self.metrics.appended(str(type(env.body).__struct_config__.tag))
        return Appended(seq=ack.seq, duplicate=bool(ack.duplicate), envelope=env)

    async def entry(self, seq: int) -> LogEntry:
        """The log entry at ``seq`` (direct get)."""
        raw = await self.js.get_msg(subjects.EVENTS_STREAM, seq=seq, direct=True)
        return decode_entry(seq, raw.subject or "", raw.data or b"")

    async def last_entry(self, subject: str) -> LogEntry | None:
        """The last entry on ``subject``, or None if there is none."""
        try:
            raw = await self.js.get_last_msg(subjects.EVENTS_STREAM, subject, direct=True)
        except NotFoundError:
            return None
        return decode_entry(raw.seq or 0, raw.subject or subject, raw.data or b"")

    async def last_entries(self, wanted: Sequence[str]) -> dict[str, LogEntry]:
        """The newest entry of each subject of ``wanted`` that has one, by subject: batched direct gets
        (``last_entries.py``)."""
        return await last_entries(self.nc, subjects.EVENTS_STREAM, wanted)

    async def last_seq(self) -> int:
        """Sequence of the newest entry of the log (0 if empty)."""
        info = await self.js.stream_info(subjects.EVENTS_STREAM)
        return int(info.state.last_seq)

    async def read(
        self, from_seq: int = 1, subject: str = subjects.EVENTS_SUBJECTS, follow: bool = False
    ) -> AsyncGenerator[LogEntry, None]:
        """Entries in log order from ``from_seq``; stops when caught up unless ``follow``."""
        end = await self.last_seq()
        if not follow and end < from_seq:
            return
        # A callback fills a bounded queue: while the reader is busy the callback waits, so flow
        # control holds the server back (no unbounded buffering of a long log), and the reader takes
        # messages without a timer per message when the queue is not empty.
        queue: asyncio.Queue[Msg] = asyncio.Queue(maxsize=4096)
        sub = await self.js.subscribe(
            subject,
            stream=subjects.EVENTS_STREAM,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            config=api.ConsumerConfig(opt_start_seq=from_seq),
            cb=queue.put,
        )
        try:
            while True:
                try:
                    msg = queue.get_nowait()
                except asyncio.QueueEmpty:
                    try:
                        msg = await asyncio.wait_for(queue.get(), 1.0 if follow else 5.0)
                    except TimeoutError:
                        if follow:
                            continue
                        if await self.last_seq() <= end:
                            return
                        continue
                meta = msg.metadata
                yield decode_entry(meta.sequence.stream, msg.subject, msg.data, meta.num_pending)
                if not follow and (meta.sequence.stream >= end or meta.num_pending == 0):
                    return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def entries(
        self,
        subject_filters: Sequence[str],
        wanted: Callable[[str], bool] | None = None,
        slim: bool = False,
    ) -> AsyncIterator[LogEntry]:
        """Entries on any of ``subject_filters`` in log order, up to the newest there when it started; those
        whose subject ``wanted`` refuses are skipped undecoded; ``slim``: submissions without their script
        and environment (``log_entries.filtered``: in bulk, nats-py where the bulk reader cannot go)."""
        return log_entries.filtered(self.nc, self.js, subject_filters, wanted, slim)

    async def publish_order(self, subject: str, data: bytes, msg_id: str) -> int:
        """Put an order on a node's work subject; a republished order is deduplicated."""
        try:
            # pipelined: the orders of one cycle go out together (``Pipeline``)
            ack = await self.pipeline.publish(subject, data, {"Nats-Msg-Id": msg_id})
        except (APIError, TimeoutError, *UNAVAILABLE) as exc:
            raise TransientError(f"order to {subject} failed: {exc!r}") from exc
        return int(ack.seq)

    async def dead_letter(self, service: str, msg: Msg, reason: str) -> None:
        """Keep a rejected asynchronous message with its reason, for an operator to inspect."""
        headers = {"Corral-Reason": reason[:500], "Corral-Subject": msg.subject}
        with contextlib.suppress(Exception):
            await self.js.publish(subjects.dlq_subject(service), msg.data, headers=headers)
            if self.metrics is not None:
                self.metrics.dead_lettered(service, REJECTED)

    async def dead_letter_entry(self, service: str, entry: LogEntry, reason: str) -> bool:
        """Keep a copy of the log entry ``entry`` that ``service`` skipped, with its reason.

        The copy's message id names the entry (its sequence and event id), so a service that meets the same
        entry again (every replay does) adds no second copy. True if this call added the copy;
        TransientError if it could not be written.
        """
        event_id = entry.envelope.meta.event_id if entry.envelope is not None else ""
        headers = {
            "Corral-Reason": reason[:500],
            "Corral-Subject": entry.subject,
            "Corral-Seq": str(entry.seq),
            "Nats-Msg-Id": f"{service}:{entry.seq}:{event_id}",
        }
        try:
            raw = await self.js.get_msg(subjects.EVENTS_STREAM, seq=entry.seq, direct=True)
            ack = await self.js.publish(subjects.dlq_subject(service), raw.data or b"", headers=headers)
        except (APIError, TimeoutError, *UNAVAILABLE) as exc:
            raise TransientError(f"dead letter of log entry {entry.seq} failed: {exc!r}") from exc
        if self.metrics is not None and not ack.duplicate:
            self.metrics.dead_lettered(service, SKIPPED_ENTRY)
        return not ack.duplicate

    async def next_job_id(self, count: int = 1) -> int:
        """Allocate ``count`` consecutive job ids and return the first (``job_ids.NatsJobIds``)."""
        return await self.job_ids.next_job_id(count)

    async def last_job_id(self) -> int:
        """The highest job id allocated so far (0 if none)."""
        return await self.job_ids.last_job_id()

    async def consume(
        self,
        stream: str,
        durable: str,
        subject: str,
        handler: Callable[[list[Msg]], Awaitable[None]],
        *,
        service: str,
        batch: int = 256,
        stop: asyncio.Event | None = None,
        pause: Callable[[int], float] | None = None,
        start_seq: int = 1,
        bind: bool = False,
    ) -> None:
        """Run a durable pull consumer until ``stop`` is set.

        ``handler`` gets a batch of messages; it succeeds (all acked), raises TransientError (all
        nak'ed with a delay) or InvalidInput (the batch is retried one by one so that only the bad
        message is terminated and dead-lettered). ``pause``, given the size of the last fetch, says how
        many seconds to wait before the next one (a consumer that need not follow the log at once, so that
        the entries gather and it wakes once for them); ``stop`` ends the wait. ``start_seq``: where a
        consumer created now starts (an existing one goes on from its own acks). ``bind``: the consumer exists
        already, with its filter (an agent's, created by the admin: ``streams.declare``); it is neither
        created nor changed, and ``subject`` is not used.
        """
        if bind:
            psub = await self.js.pull_subscribe_bind(durable=durable, stream=stream)
        else:
            config = api.ConsumerConfig(ack_wait=60.0, max_ack_pending=10_000)
            if start_seq > 1:
                config.deliver_policy, config.opt_start_seq = api.DeliverPolicy.BY_START_SEQUENCE, start_seq
            psub = await self.js.pull_subscribe(subject, durable=durable, stream=stream, config=config)
        stop = stop or asyncio.Event()
        polled = 0.0
        fetched = 0
        try:
            while not stop.is_set():
                wait = pause(fetched) if pause is not None else 0.0
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
                    if stop.is_set():
                        break
                fetched = 0
                if self.metrics is not None and time.monotonic() - polled >= LAG_POLL_S:
                    polled = time.monotonic()
                    await self._record_lag(psub, stream, durable)
                try:
                    msgs = await psub.fetch(batch, timeout=1.0)
                except TimeoutError:  # nats.errors.TimeoutError is one too
                    continue
                except UNAVAILABLE:
                    # JetStream is between leaders (a server of the cluster was lost) or the connection is
                    # being re-established: the consumer is still there, fetch again in a moment.
                    telemetry.logger().warning("JetStream unavailable; fetching again", consumer=durable)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), UNAVAILABLE_PAUSE_S)
                    continue
                fetched = len(msgs)
                if msgs:
                    await self._handle(msgs, handler, service)
        finally:
            with contextlib.suppress(Exception):
                await psub.unsubscribe()

    async def _record_lag(self, psub: JetStreamContext.PullSubscription, stream: str, durable: str) -> None:
        """Record the durable consumer's lag (a failed read only leaves the last value)."""
        assert self.metrics is not None
        try:
            info = await psub.consumer_info()
        except Exception:
            return
        self.metrics.consumer_lag(stream, durable, int(info.num_pending or 0), int(info.num_ack_pending or 0))

    async def _handle(
        self, msgs: list[Msg], handler: Callable[[list[Msg]], Awaitable[None]], service: str
    ) -> None:
        try:
            await handler(msgs)
        except TransientError:
            for msg in msgs:
                await msg.nak(delay=2.0)
            return
        except InvalidInput as exc:
            if len(msgs) == 1:
                await self.dead_letter(service, msgs[0], str(exc))
                await msgs[0].term()
                return
            for msg in msgs:
                await self._handle([msg], handler, service)
            return
        for msg in msgs:
            await msg.ack()


def entry_of(msg: Msg) -> LogEntry:
    """The log entry a consumed event message carries."""
    return decode_entry(msg.metadata.sequence.stream, msg.subject, msg.data)
