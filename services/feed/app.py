"""The feed service: the log projected into the job event feed (stream ``CORRAL_FEED``) for subscribers.

Users may not read the log (it holds every user's scripts and environments, and its subjects carry no
user), so this service republishes a documented subset of it (``schemas/feed.py``) on subjects that name
each job's account and user, where the NATS permissions can give each user their own jobs only.

The cycle:

1. start: the feed's newest message says which log entry was projected last (``FeedMessage.log_seq``);
2. read: the log from its first entry, in order (an ordered consumer, ``Bus.read``), each entry folded by
   the projector (``project.Projector``: the scheduler's fold), so that its state at any entry is the one
   every other consumer has there;
3. publish: from that last projected entry on, the messages each entry makes, each with its message id and
   an acknowledgement from the stream before the next (retried until it is taken), so the feed's order is the
   log's; the consumer ``feed-<user>`` of each user it meets is created first, filtered on that user's jobs.

Exactly once, in order: a crash between two messages of one entry publishes that entry's messages again at
the restart, and the stream drops the ones it has (``Nats-Msg-Id`` within ``DUPLICATE_WINDOW_S``); two
replicas both publish every message, in log order each, so the first copy of each message comes after the
first copy of the one before it and the second copy is dropped. A replica that falls further behind than the
duplicate window would publish its copies again: run one replica per cluster, a second for failover only.
The cost of a start is a pass over the whole log (the fold); the scheduler's snapshots would bound it.
"""

from __future__ import annotations

import asyncio
import contextlib

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


class FeedService:
    """Projects the log into the feed (the cycle is in the module docstring)."""

    def __init__(self, bus: Bus, min_job_age_s: float = 0.0) -> None:
        self.bus = bus
        self.projector = Projector(min_job_age_s)  # (forgets ended jobs at the scheduler's MinJobAge)
        self.readers: set[str] = set()  # users whose feed consumer this process has made sure of
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
        finally:
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
        """Step 3 for one message: until the stream has it (or ``stop``)."""
        event = item.message.event
        if not isinstance(event, feed.FeedNode) and event.user not in self.readers:
            await self._reader(event.user, stop)
        data = encode(item.message)
        while not stop.is_set():
            try:
                await self.bus.js.publish(item.subject, data, headers={"Nats-Msg-Id": item.msg_id})
                return
            except (APIError, TimeoutError, *UNAVAILABLE) as exc:
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
