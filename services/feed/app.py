"""The feed service: the log projected into the job event feed (stream ``CORRAL_FEED``) for subscribers.

Users may not read the log (it holds every user's scripts and environments, and its subjects carry no
user), so this service republishes a documented subset of it (``schemas/feed.py``) on subjects that name
each job's account and user, where the NATS permissions can give each user their own jobs only.

The cycle:

1. start: the feed's newest message says which log entry was projected last (``FeedMessage.log_seq``);
2. read: the log from its first entry, in order (an ordered consumer, ``Bus.read``), each entry folded by
   the projector (``project.Projector``: the scheduler's fold), so that its state at any entry is the one
   every other consumer has there;
3. publish: from that last projected entry on, the messages each entry makes, each with its message id, in
   the log's order; the consumer ``feed-<user>`` of each user it meets is created first, filtered on that
   user's jobs. Up to ``WINDOW`` messages are out at once, each but the first naming the one before it
   (``Nats-Expected-Last-Msg-Id``): the stream takes a message only right after its predecessor, so what it
   holds is always the feed's messages in order, with none missing. When one is not taken (refused, or its
   acknowledgement did not come), the window is waited out and its messages from that one on are published
   again one at a time, each acknowledged before the next (retried until it is taken; those the stream
   already has are dropped by id). The window's messages are acknowledged before the service waits for the
   next log entry. (One at a time, as before 2026-12-07, a message cost ~150 us of the service's CPU, its
   round trip; ``bench/RESULTS.md``.)

Exactly once, in order: a crash between two messages of one entry publishes that entry's messages again at
the restart, and the stream drops the ones it has (``Nats-Msg-Id`` within ``DUPLICATE_WINDOW_S``); two
replicas both publish every message, in log order each, so the first copy of each message comes after the
first copy of the one before it and the second copy is dropped. A replica that falls further behind than the
duplicate window would publish its copies again: run one replica per cluster, a second for failover only.
The cost of a start is a pass over the whole log (the fold); the scheduler's snapshots would bound it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

from nats.js import api
from nats.js.errors import APIError, NotFoundError

from corral.libs.infra import roles
from corral.libs.runtime import streams
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.job_ids import UNAVAILABLE
from corral.libs.runtime.service import Context
from corral.libs.runtime.telemetry import logger
from corral.schemas import feed, subjects
from corral.schemas.codec import DecodeError, decode, encode
from corral.services.feed.project import Projector, Published

#: Seconds between two tries of a publish the stream did not take.
RETRY_S = 0.5
#: Messages out at once, awaiting their acknowledgement (step 3).
WINDOW = 64
#: What the stream refuses, or what keeps its answer from coming: the window is then published again.
NOT_TAKEN = (APIError, TimeoutError, *UNAVAILABLE)

#: A message out: what it is, its bytes, and its acknowledgement to come.
Out = tuple[Published, bytes, "asyncio.Future[api.PubAck]"]


class FeedService:
    """Projects the log into the feed (the cycle is in the module docstring)."""

    def __init__(self, bus: Bus, min_job_age_s: float = 0.0) -> None:
        self.bus = bus
        self.projector = Projector(min_job_age_s)  # (forgets ended jobs at the scheduler's MinJobAge)
        self.readers: set[str] = set()  # users whose feed consumer this process has made sure of
        self.window: collections.deque[Out] = collections.deque()  # messages out, oldest first
        self.log = logger(service="feed")

    async def run(self, stop: asyncio.Event) -> None:
        """Steps 1-3 until ``stop`` is set (the read follows the log: it is cancelled then)."""
        project = asyncio.create_task(self.project(stop))
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({project, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (project, stopped):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if project.done() and not project.cancelled() and project.exception() is not None:
            raise project.exception()  # type: ignore[misc]

    async def project(self, stop: asyncio.Event) -> None:
        """Steps 2-3: fold every entry of the log; publish the messages of those from the last projected."""
        start = await self.last_projected()
        self.log.info("projecting the log into the feed", from_seq=start)
        entries = self.bus.read(1, follow=True)
        try:
            async for entry in entries:
                if entry.envelope is None:
                    self.projector.skip(entry.seq, entry.subject)
                    continue
                published = self.projector.add(entry.seq, entry.envelope)
                if entry.seq >= start:
                    for item in published:
                        await self.publish(item, stop)
                if entry.pending == 0:
                    await self.settle(stop)  # caught up: every message out is taken before the wait
        finally:
            for _, _, future in self.window:
                future.cancel()  # the stream holds an unbroken prefix of them: a restart goes on from it
            self.window.clear()
            await entries.aclose()

    async def last_projected(self) -> int:
        """Step 1: the log sequence of the feed's newest message (0 for an empty feed)."""
        info = await self.bus.js.stream_info(subjects.FEED_STREAM)
        last = int(info.state.last_seq)
        if last == 0:
            return 0
        try:
            raw = await self.bus.js.get_msg(subjects.FEED_STREAM, seq=last, direct=True)
        except NotFoundError:
            return 0
        try:
            return int(decode(raw.data or b"", feed.FeedMessage).log_seq)
        except DecodeError:
            return 0

    async def publish(self, item: Published, stop: asyncio.Event) -> None:
        """Step 3 for one message: out in the window, after the one before it (the oldest is waited for
        once the window is full)."""
        event = item.message.event
        if not isinstance(event, feed.FeedNode) and event.user not in self.readers:
            await self._reader(event.user, stop)
        data = encode(item.message)
        headers = {"Nats-Msg-Id": item.msg_id}
        if self.window:  # the one before it is out: the stream takes this one only right after it
            headers["Nats-Expected-Last-Msg-Id"] = self.window[-1][0].msg_id
        publish = self.bus.pipeline.publish(item.subject, data, headers)
        self.window.append((item, data, asyncio.ensure_future(publish)))
        if len(self.window) >= WINDOW:
            await self.settle(stop, WINDOW // 2)

    async def settle(self, stop: asyncio.Event, keep: int = 0) -> None:
        """Wait for the window's oldest messages until at most ``keep`` are out; from the first one not taken,
        every message of the window is published again in order, one at a time (``publish_one``)."""
        while len(self.window) > keep:
            item, _, future = self.window[0]
            try:
                await future
            except NOT_TAKEN as exc:
                self.log.warning("feed publish failed; again in order", subject=item.subject, error=repr(exc))
                again = list(self.window)
                self.window.clear()
                for _, _, out in again:  # each settled (taken, refused or timed out) before any is sent again
                    with contextlib.suppress(*NOT_TAKEN):
                        await out
                for message, message_data, _ in again:
                    await self.publish_one(message, message_data, stop)
                return
            self.window.popleft()

    async def publish_one(self, item: Published, data: bytes, stop: asyncio.Event) -> None:
        """One message, acknowledged before anything follows it: until the stream has it (or ``stop``)."""
        while not stop.is_set():
            try:
                await self.bus.pipeline.publish(item.subject, data, {"Nats-Msg-Id": item.msg_id})
                return
            except NOT_TAKEN as exc:
                self.log.warning("feed publish failed; retrying", subject=item.subject, error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)

    async def _reader(self, user: str, stop: asyncio.Event) -> None:
        """The consumer ``feed-<user>``, filtered on the user's jobs: the only one the user may read."""
        while not stop.is_set():
            try:
                await self.bus.js.add_consumer(
                    subjects.FEED_STREAM, streams.feed_reader(user, roles.FeedScope(users=(user,)).filters())
                )
                self.readers.add(user)
                return
            except (APIError, TimeoutError, *UNAVAILABLE) as exc:
                self.log.warning("feed consumer not created; retrying", user=user, error=repr(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)


async def main(ctx: Context) -> None:
    """The composition root."""
    await FeedService(ctx.bus, float(ctx.config.scheduler.min_job_age_s)).run(ctx.stop)
