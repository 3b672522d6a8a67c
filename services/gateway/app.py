"""The gateway: accepts job requests (submit and submit_batch in ``submission.py``; cancel, hold, release,
update, requeue, signal here), admins' reservation requests (``reservations.py``) and node drain/resume
requests (``nodes.py``); appends the accepted as intents. It also answers ``history`` (``corral audit``,
``history.py``) from the log.

Each verb handles up to ``CONCURRENCY`` requests at once (``api_server.serve``): a request waits on JetStream
most of its time (its reads, its append), and the others go on meanwhile, their appends pipelined on the
gateway's connection. Several gateways share the requests (the ``gateway`` queue group).

A service account submits on behalf of a user of its scope (``behalf.py``): the job is the user's.

Roles: ``--admin`` users and ``[cluster] admins`` may act on every job, an account's ``coordinators`` on its
jobs and its sub-accounts' (``control.may_control``); ``--auditor`` users may read every history and call no
verb that writes (every verb but ``history`` is refused to them, ``handlers``).

Cycle of one request:
1. take the caller from the request subject (bound to the authenticated connection);
2. validate the request against the cluster configuration (rejections leave no trace in the log);
3. append the intent with an idempotency key (``Nats-Msg-Id``), so a retried request is one event;
4. reply with the outcome.

``Gateway`` takes the log, the job id counter, the scheduler's API and the clock as ports
(``libs/runtime/ports.py``): ``main`` gives it NATS and the system clock, the unit tests the in-memory fakes.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from corral.libs.config.cluster import ClusterConfig
from corral.libs.runtime.api_server import serve
from corral.libs.runtime.bus import NatsApi
from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.errors import Forbidden, InvalidInput
from corral.libs.runtime.ports import ApiClient, Clock, EventLog, JobIds
from corral.libs.runtime.service import Context
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.api_requests import MAX_PRIORITY, MAX_SIGNAL
from corral.services.gateway import control
from corral.services.gateway.asks import SchedulerAsks
from corral.services.gateway.history import History
from corral.services.gateway.lookup import Found, JobLookup, at_once
from corral.services.gateway.nodes import NodeUpdates
from corral.services.gateway.policy import check_policy
from corral.services.gateway.reservations import Reservations
from corral.services.gateway.submission import DEPENDENCY_PROBLEM as DEPENDENCY_PROBLEM  # re-exported
from corral.services.gateway.submission import RawBatch, Submissions
from corral.services.gateway.validate import validate_spec

#: Requests of one verb a gateway handles at once (a submission waits on JetStream most of its time).
CONCURRENCY = 256
#: Job ids a gateway holds beyond its submissions' (``id_blocks``): a single submission is then one round trip
#: to JetStream, not two; a stop skips at most these, and two gateways' ids interleave within them.
IDS_AHEAD = 32
#: A verb's handler: (caller, request) -> reply.
Handler = Callable[[str, Any], Awaitable[Any]]


class Gateway:
    """Submit, cancel, hold, release and update on ``corral.api.v1.<verb>.<user>``."""

    def __init__(
        self,
        events: EventLog,
        ids: JobIds,
        scheduler: ApiClient,
        config: ClusterConfig,
        clock: Clock,
        admins: frozenset[str] = frozenset(),
        auditors: frozenset[str] = frozenset(),
    ) -> None:
        self.events = events
        self.ids = ids
        self.asks = SchedulerAsks(scheduler)
        self.config = config
        admins = admins | frozenset(config.admins)  # --admin (corral up's admin role) and [cluster] admins
        self.admins = admins
        self.auditors = auditors - admins  # an admin named auditor too keeps the admin's rights
        self.lookup = JobLookup(events, ids)
        self.reservations = Reservations(events, config, admins, clock)
        self.submissions = Submissions(events, ids, self.asks, config, admins, self.lookup, self.reservations)
        self.submit = self.submissions.submit
        self.submit_batch = self.submissions.submit_batch
        self.node_updates = NodeUpdates(events, config, admins, clock)
        self.history = History(events, self.lookup, admins, self.auditors)

    def handlers(self) -> dict[str, tuple[type[Any], Handler]]:
        """Every verb the gateway serves: its request type and handler; the writing verbs refuse auditors."""
        writers: dict[str, tuple[type[Any], Handler]] = {
            "submit": (api.SubmitRequest, self.submit),
            "submit_batch": (RawBatch, self.submit_batch),
            "cancel": (api.CancelRequest, self.cancel),
            "hold": (api.HoldRequest, self.hold),
            "release": (api.ReleaseRequest, self.release),
            "update": (api.UpdateRequest, self.update),
            "requeue": (api.RequeueRequest, self.requeue),
            "signal": (api.SignalRequest, self.signal),
            "create_reservation": (api.CreateReservationRequest, self.reservations.create),
            "delete_reservation": (api.DeleteReservationRequest, self.reservations.delete),
            "update_node": (api.NodeUpdateRequest, self.node_updates.update),
        }
        served = {verb: (kind, self._read_only_refused(verb, h)) for verb, (kind, h) in writers.items()}
        served["history"] = (api.HistoryRequest, self.history.history)
        return served

    def _read_only_refused(self, verb: str, handler: Handler) -> Handler:
        """``handler``, refusing the auditor role (read-only) before it runs."""

        async def guarded(user: str, request: Any) -> Any:
            if user in self.auditors:
                raise Forbidden(
                    f"Access/permission denied: {user} has the auditor role, which is read-only: "
                    f"it may not {verb.replace('_', ' ')}"
                )
            return await handler(user, request)

        return guarded

    async def hold(self, user: str, req: api.HoldRequest) -> api.ControlReply:
        """Append JobHoldRequested for each pending job the caller may hold."""
        return await self._each(
            user, req.job_ids, req.tasks, lambda j, f: self._control_one(user, j, f, False)
        )

    async def release(self, user: str, req: api.ReleaseRequest) -> api.ControlReply:
        """Append JobReleaseRequested for each pending job the caller may release."""
        return await self._each(
            user, req.job_ids, req.tasks, lambda j, f: self._control_one(user, j, f, True)
        )

    async def _control_one(self, user: str, job_id: int, found: Found, release: bool) -> str | None:
        problem = await self._phase_problem(job_id)
        if problem is not None:
            return problem
        admin = user in self.admins
        if (
            release
            and not admin
            and control.admin_hold(
                await self._last(job_id, "job_held"), await self._last(job_id, "job_released")
            )
        ):
            return control.DENIED
        intent: ev.Event
        if release:
            intent = ev.JobReleaseRequested(job_id=ev.JobId(job_id), user=user, admin=admin)
        else:
            intent = ev.JobHoldRequested(job_id=ev.JobId(job_id), user=user, admin=admin)
        traceparent = found.envelope.meta.traceparent
        await self.events.append(intent, correlation_id=str(job_id), traceparent=traceparent)
        return None

    async def _phase_problem(self, job_id: int) -> str | None:
        """Slurm's refusal if the job runs or ended (from its newest entry), None while it is pending."""
        return control.phase_problem(await self._latest(job_id))

    async def update(self, user: str, req: api.UpdateRequest) -> api.ControlReply:
        """Append JobUpdateRequested for a pending job the caller may change (scontrol update JobId=)."""
        if req.time_limit_s is None and req.partition is None and req.priority is None:
            raise InvalidInput("nothing to update: give TimeLimit=, Partition= or Priority=", field="job_id")
        if req.priority is not None and not 0 <= req.priority <= MAX_PRIORITY:
            raise InvalidInput(f"Priority must be 0-{MAX_PRIORITY}, not {req.priority}", field="priority")
        error = await self._update_one(user, req)
        return api.ControlReply(outcomes=[api.JobOutcome(job_id=req.job_id, error=error)])

    async def _update_one(self, user: str, req: api.UpdateRequest) -> str | None:
        found = await self.lookup.find(req.job_id)
        if found is None:
            return control.INVALID_JOB
        if not self._may_control(user, found):
            return control.DENIED
        if found.whole_array:
            return control.ARRAY_UPDATE
        problem = await self._phase_problem(req.job_id)
        if problem is not None:
            return problem
        admin = user in self.admins
        current = control.current_spec(found.submitted.spec, await self._last(req.job_id, "job_updated"))
        changed = msgspec.structs.replace(
            current,
            time_limit_s=req.time_limit_s if req.time_limit_s is not None else current.time_limit_s,
            partition=req.partition if req.partition is not None else current.partition,
        )
        validate_spec(changed, self.config)
        check_policy(changed, found.user, self.config, admin=True)
        # As in Slurm, only an admin may raise a time limit.
        if not admin and req.time_limit_s is not None and req.time_limit_s > self._limit(current):
            return control.DENIED
        # As in Slurm, only an admin sets a job's priority.
        if not admin and req.priority is not None:
            return control.DENIED
        await self.events.append(
            ev.JobUpdateRequested(
                job_id=ev.JobId(req.job_id),
                user=user,
                admin=admin,
                time_limit_s=req.time_limit_s,
                partition=req.partition,
                priority=req.priority,
            ),
            correlation_id=str(req.job_id),
            traceparent=found.envelope.meta.traceparent,
        )
        return None

    def _limit(self, spec: ev.JobSpec) -> float:
        """The time limit a job's spec gives it (its partition's default when unset; inf: unlimited)."""
        if spec.time_limit_s is not None:
            return spec.time_limit_s
        part = self.config.partition(spec.partition) if spec.partition else self.config.default_partition
        limit = None
        if part is not None:
            limit = part.default_time_s if part.default_time_s is not None else part.max_time_s
        return float("inf") if limit is None else limit

    async def _last(self, job_id: int, tag: str) -> tuple[int, ev.Event] | None:
        entry = await self.events.last_entry(subjects.job_subject(job_id, tag))
        if entry is None or entry.envelope is None:
            return None
        return entry.seq, entry.envelope.body

    async def cancel(self, user: str, req: api.CancelRequest) -> api.CancelReply:
        """Append JobCancelRequested for each job the caller may cancel (an array's id: one entry for all);
        Forbidden, before anything is appended, if the caller may not cancel one of them."""
        targets = await self.lookup.targets(req.job_ids, req.tasks)
        jobs = [target.found for target in targets if target.found is not None]
        for job in jobs:
            if not self._may_control(user, job):
                raise Forbidden(f"Access/permission denied: job {job.job_id} belongs to {job.user}")
        # The jobs' appends pipelined (``lookup.at_once``): thousands of jobs (scancel -u) in seconds.
        await at_once(jobs, lambda job: self._cancel_one(user, job))
        return api.CancelReply(
            outcomes=[
                api.CancelOutcome(
                    job_id=target.job_id,
                    error=None if target.found is not None else control.INVALID_JOB,
                    array_task_id=target.index,
                )
                for target in targets
            ]
        )

    async def requeue(self, user: str, req: api.RequeueRequest) -> api.ControlReply:
        """Append JobRequeueRequested for each running job the caller may requeue (requeuehold of a pending
        job holds it, as in Slurm). The reply comes at once: the kill and the requeue follow."""
        return await self._each(
            user,
            req.job_ids,
            req.tasks,
            lambda job_id, found: self._requeue_one(user, job_id, found, req.hold),
        )

    async def _requeue_one(self, user: str, job_id: int, found: Found, hold: bool) -> str | None:
        if not found.submitted.spec.requeue:
            return control.REQUEUE_DISABLED  # --no-requeue, as Slurm refuses it
        problem = control.run_problem(await self._latest(job_id))
        if problem == control.PENDING and hold:
            return await self._control_one(user, job_id, found, release=False)
        if problem is not None:
            return problem
        await self.events.append(
            ev.JobRequeueRequested(job_id=ev.JobId(job_id), user=user, hold=hold),
            correlation_id=str(job_id),
            traceparent=found.envelope.meta.traceparent,
        )
        return None

    async def signal(self, user: str, req: api.SignalRequest) -> api.ControlReply:
        """Append JobSignalRequested for each running job the caller may signal (scancel -s)."""
        if not 1 <= req.signal <= MAX_SIGNAL:
            raise InvalidInput(f"signal must be 1-{MAX_SIGNAL}, not {req.signal}", field="signal")
        return await self._each(
            user, req.job_ids, req.tasks, lambda job_id, found: self._signal_one(user, job_id, found, req)
        )

    async def _signal_one(self, user: str, job_id: int, found: Found, req: api.SignalRequest) -> str | None:
        problem = control.run_problem(await self._latest(job_id))
        if problem is not None:
            return problem
        await self.events.append(
            ev.JobSignalRequested(
                job_id=ev.JobId(job_id),
                user=user,
                signal=req.signal,
                scope=req.scope,
                request_id=uuid.uuid4().hex,
            ),
            correlation_id=str(job_id),
            traceparent=found.envelope.meta.traceparent,
        )
        return None

    async def _each(
        self,
        user: str,
        job_ids: list[int],
        tasks: list[api.ArrayTasks],
        act: Callable[[int, Found], Awaitable[str | None]],
    ) -> api.ControlReply:
        """Apply ``act`` to every job a request names that the caller owns (every task of an array's id:
        an error only if no task could be acted on)."""
        targets = await self.lookup.targets(job_ids, tasks)
        allowed = {
            k: t.found
            for k, t in enumerate(targets)
            if t.found is not None and self._may_control(user, t.found)
        }
        # Every job of every allowed target (each task of an array's id), acted on pipelined.
        work = [(k, job_id, found) for k, found in allowed.items() for job_id in found.job_ids]
        results = await at_once(work, lambda item: act(item[1], item[2]))
        errors: dict[int, list[str | None]] = {k: [] for k in allowed}
        for (k, _, _), result in zip(work, results, strict=True):
            errors[k].append(result)
        outcomes = []
        for k, target in enumerate(targets):
            error: str | None = control.INVALID_JOB
            if k in errors:
                error = None if None in errors[k] else errors[k][0]
            elif target.found is not None:
                error = control.DENIED
            outcomes.append(api.JobOutcome(job_id=target.job_id, error=error, array_task_id=target.index))
        return api.ControlReply(outcomes=outcomes)

    def _may_control(self, user: str, found: Found) -> bool:
        return control.may_control(user, found.submitted, self.config, self.admins)

    async def _latest(self, job_id: int) -> ev.Event | None:
        """The newest event on the job's own subject."""
        latest = await self.events.last_entry(subjects.job_events(job_id))
        return latest.envelope.body if latest and latest.envelope else None

    async def _cancel_one(self, user: str, found: Found) -> None:
        await self.events.append(
            ev.JobCancelRequested(job_id=ev.JobId(found.job_id), user=user, whole_array=found.whole_array),
            correlation_id=str(found.job_id),
            traceparent=found.envelope.meta.traceparent,
        )


async def main(ctx: Context) -> None:
    """Serve until stopped."""
    ctx.bus.job_ids.hold_ahead(IDS_AHEAD)
    gateway = Gateway(
        ctx.bus,
        ctx.bus,
        NatsApi(ctx.nc, ctx.bus.actor),
        ctx.config,
        SystemClock(),
        admins=frozenset(ctx.args.admin or []),
        auditors=frozenset(ctx.args.auditor or []),
    )
    subs = [
        await serve(ctx.nc, verb, kind, handler, queue="gateway", concurrency=CONCURRENCY)
        for verb, (kind, handler) in gateway.handlers().items()
    ]
    await ctx.stop.wait()
    for sub in subs:
        await sub.unsubscribe()
