"""What a scheduling cycle sends (``app.py``'s steps 3 and 4): the decisions, appended to the log conditional
on their job's (or reservation's) subject not having changed since, and the per-node orders the folded state
needs, on the work stream with deterministic message ids.

Each kind goes together (``every``): started in order, each publishes before it first waits, so one
connection carries them to the server in that order in one round trip (``libs/runtime/pipeline.py``); of two
decisions on one job the first still wins (the second's expected sequence is stale, and a superseded decision
asks for a new plan). The launches' full specs are read first (recent ones are kept, older ones read back from
the log), so a run's orders go out in their order: a signal never overtakes its launch.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec

from corral.libs.core.causation import cause_of
from corral.libs.core.orders import orders
from corral.libs.core.policy import Policy
from corral.libs.core.state import State
from corral.libs.runtime import telemetry
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import AppendConflict, TransientError
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import encode
from corral.schemas.events import Event
from corral.services.scheduler.metrics import SchedulerMetrics
from corral.services.scheduler.replay import slim_verdict


class Sending:
    """The sends of a ``Scheduler`` (its log, state and lease are the attributes below)."""

    bus: Bus
    state: State
    policy: Policy
    metrics: SchedulerMetrics | None
    inflight: int
    replan: bool
    sent: set[str]
    recent_specs: OrderedDict[int, ev.JobSpec]
    log: Any  # (structlog's)

    @property
    def epoch(self) -> int:
        raise NotImplementedError  # the Scheduler's

    def leading(self) -> bool:
        raise NotImplementedError  # the Scheduler's

    async def publish(self, decision: Event) -> None:
        """Append one decision, conditional on the job not having changed since we saw it; none once the
        lease is lost (a pause mid-cycle): the fold fences what still gets through by its epoch."""
        assert not isinstance(decision, ev.NodeEvent)
        if not self.leading():
            raise TransientError("not the leader any more")
        if isinstance(decision, ev.RESERVATION_EVENTS):
            await self.publish_reservation(decision)
            return
        job_id = decision.job_id
        job = self.state.jobs[job_id]
        with telemetry.about_job(job_id, job.traceparent):
            await self._append_decision(decision, job_id)

    async def _append_decision(self, decision: Event, job_id: int) -> None:
        job = self.state.jobs[job_id]
        tag = type(decision).__struct_config__.tag
        try:
            appended = await self.bus.append(
                decision,
                # The epoch too: a deposed leader's (fenced) decision must not make its successor's
                # identical one look like a retry of it.
                msg_id=f"{job_id}:{tag}:{job.last_seq}:{self.epoch}",
                expect_last_seq=job.last_seq,
                expect_subject=subjects.job_events(job_id),
                correlation_id=str(job_id),
                traceparent=job.traceparent,
                causation_id=cause_of(self.state, decision),
            )
        except AppendConflict:
            self.log.info("decision superseded by a newer event", job_id=job_id, decision=tag)
            self.replan = True  # the plan counted it: plan again
            return
        self.inflight = max(self.inflight, appended.seq)
        if (
            self.metrics is not None
            and isinstance(decision, ev.JobAllocated)
            and decision.attempt == 0
            and not appended.duplicate
        ):
            # A job's first allocation: its wait since submission (a requeued run's is not counted again).
            self.metrics.allocated(decision.partition, appended.envelope.meta.occurred_at - job.submit_time)

    async def publish_reservation(self, decision: ev.ReservationEvent) -> None:
        """Append a reservation decision, conditional on no newer request for that name."""
        name = decision.name
        last = self.state.resv_seqs.get(name, 0)
        tag = type(decision).__struct_config__.tag
        try:
            appended = await self.bus.append(
                decision,
                msg_id=f"resv:{name}:{tag}:{last}:{self.epoch}",
                expect_last_seq=last,
                expect_subject=subjects.resv_events(name),
                correlation_id=name,
                causation_id=cause_of(self.state, decision),
            )
        except AppendConflict:
            self.log.info("reservation decision superseded", reservation=name, decision=tag)
            return
        self.inflight = max(self.inflight, appended.seq)

    async def send_orders(self) -> None:
        """Put the orders the state needs that this process has not sent yet."""
        needed = {api.order_msg_id(order): order for order in orders(self.state, self.policy)}
        # The ids of orders the state no longer needs are forgotten: the set stays the size of the work in
        # flight, not of every order this process ever sent. One needed again (a kill's id is one per run and
        # node, whatever its reason) is sent again: the work stream's deduplication or the agent, which
        # launches and kills a run once, drops it.
        self.sent &= needed.keys()
        new = [(msg_id, order) for msg_id, order in needed.items() if msg_id not in self.sent]
        # The launches' full specs first (some are read back from the log), so that the orders then go out
        # in their order: a run's signal or kill never overtakes its launch.
        ready = await asyncio.gather(*(self._with_spec(order) for _, order in new))
        await every(
            self._put_order(order, msg_id)
            for (msg_id, _), order in zip(new, ready, strict=True)
            if order is not None
        )

    async def _with_spec(self, order: api.Order) -> api.Order | None:
        """``order``, a launch with its full spec; None for a launch that cannot have one (it fails)."""
        if not isinstance(order, api.LaunchOrder):
            return order
        spec = await self.full_spec(order.job_id)
        if spec is None:
            await self.fail_launch(order)
            return None
        return msgspec.structs.replace(order, spec=spec)

    async def _put_order(self, order: api.Order, msg_id: str) -> None:
        await self.bus.publish_order(subjects.work_subject(order.node), encode(order), msg_id)
        self.sent.add(msg_id)

    async def full_spec(self, job_id: int) -> ev.JobSpec | None:
        """The job's spec as submitted, script and environment included (from its log entry); None if that
        entry's script or environment does not decode (the slim decoder accepted it: ``replay.py``)."""
        seq = self.state.jobs[job_id].submit_seq
        spec = self.recent_specs.get(seq)  # (kept: every task of an array shares its submission)
        if spec is not None:
            return spec
        entry = await self.bus.entry(seq)
        if entry.envelope is None and slim_verdict(entry).envelope is not None:
            return None
        if entry.envelope is None or not isinstance(entry.envelope.body, ev.JobSubmitted):
            raise TransientError(f"job {job_id}: the log entry {seq} is not its submission")
        return entry.envelope.body.spec

    async def fail_launch(self, order: api.LaunchOrder) -> None:
        """End a job whose submission has no script or environment to launch with (LaunchFailed), as a
        launch error on its node would."""
        message = "its submission's script or environment does not decode"
        self.log.error("job cannot be launched", job_id=order.job_id, reason=message)
        failed = ev.JobFailed(
            job_id=order.job_id,
            attempt=order.attempt,
            reason="LaunchFailed",
            message=message,
            epoch=self.epoch,
        )
        await self.publish(failed)


async def every(sends: Iterable[Awaitable[None]], started: Callable[[], None] | None = None) -> None:
    """Await ``sends`` together, then raise the first one's failure, if any. They are started in their order,
    and each publishes before it first waits, so one connection carries them to the server in that order
    (one write and one round trip for all: ``Pipeline``): of two decisions on one job the first still wins.
    ``started``: called once they are scheduled, so that what it wakes runs after their first steps."""
    gathered = asyncio.gather(*sends, return_exceptions=True)
    if started is not None:
        started()
    for outcome in await gathered:
        if isinstance(outcome, BaseException):
            raise outcome
