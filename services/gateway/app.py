"""The gateway: accepts job requests (submit, cancel, hold, release, update); appends the accepted as intents.

Cycle of one request:
1. take the caller from the request subject (bound to the authenticated connection);
2. validate the request against the cluster configuration (rejections leave no trace in the log);
3. append the intent with an idempotency key (``Nats-Msg-Id``), so a retried request is one event;
4. reply with the outcome.
"""

from __future__ import annotations

import msgspec

from corral.libs import telemetry
from corral.libs.api_server import serve
from corral.libs.bus import Bus
from corral.libs.config import ClusterConfig
from corral.libs.errors import Forbidden, InvalidInput
from corral.libs.service import Context
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.services.gateway import control
from corral.services.gateway.validate import validate_spec

MAX_TOKEN = 128
MAX_CANCEL = 10_000
#: Slurm's reply to a dependency on a job that does not exist.
DEPENDENCY_PROBLEM = "Job dependency problem"
_tracer = telemetry.tracer(__name__)


class Gateway:
    """Submit, cancel, hold, release and update on ``corral.api.v1.<verb>.<user>``."""

    def __init__(self, bus: Bus, config: ClusterConfig, admins: frozenset[str] = frozenset()) -> None:
        self.bus = bus
        self.config = config
        self.admins = admins

    async def submit(self, user: str, req: api.SubmitRequest) -> api.SubmitReply:
        """Validate and append JobSubmitted; a retry with the same token returns the same job id."""
        if not req.token or len(req.token) > MAX_TOKEN:
            raise InvalidInput(f"token must be 1-{MAX_TOKEN} characters", field="token")
        validate_spec(req.spec, self.config)
        if req.spec.account is not None and not self.config.may_use(user, req.spec.account):
            raise InvalidInput(
                f"Invalid account or account/partition combination specified: {user} may not use "
                f"account {req.spec.account!r}",
                field="account",
            )
        await self._check_dependencies(req.spec)
        # The log records what the job really gets: the default partition and account are resolved here.
        spec = msgspec.structs.replace(
            req.spec,
            partition=req.spec.partition or self.config.default_partition.name,
            account=req.spec.account or self.config.default_account(user),
        )
        with _tracer.start_as_current_span("submit", attributes={"corral.user": user}) as span:
            job_id = await self.bus.next_job_id()
            span.set_attribute("corral.job_id", job_id)
            appended = await self.bus.append(
                ev.JobSubmitted(job_id=ev.JobId(job_id), user=user, spec=spec),
                msg_id=f"submit:{user}:{req.token}",
                correlation_id=str(job_id),
                traceparent=telemetry.inject(),
            )
            if appended.duplicate:
                original = await self.bus.entry(appended.seq)
                if original.envelope is None or not isinstance(original.envelope.body, ev.JobSubmitted):
                    raise InvalidInput("token was already used for another request", field="token")
                job_id = original.envelope.body.job_id
            return api.SubmitReply(job_id=job_id)

    async def _check_dependencies(self, spec: ev.JobSpec) -> None:
        """Refuse dependencies on jobs that were never submitted, as Slurm does."""
        if spec.dependencies is None:
            return
        for job_id in sorted({d.job_id for d in spec.dependencies.items if d.type != "singleton"}):
            if await self._submission(job_id) is None:
                raise InvalidInput(DEPENDENCY_PROBLEM, field="dependencies")

    async def _submission(self, job_id: int) -> tuple[ev.JobSubmitted, ev.Envelope] | None:
        """A job's submission from the log, or None if there is no such job."""
        if job_id < 1:
            return None
        entry = await self.bus.last_entry(subjects.job_subject(job_id, "job_submitted"))
        if entry is None or entry.envelope is None or not isinstance(entry.envelope.body, ev.JobSubmitted):
            return None
        return entry.envelope.body, entry.envelope

    async def hold(self, user: str, req: api.HoldRequest) -> api.ControlReply:
        """Append JobHoldRequested for each pending job the caller may hold."""
        return await self._control(user, req.job_ids, release=False)

    async def release(self, user: str, req: api.ReleaseRequest) -> api.ControlReply:
        """Append JobReleaseRequested for each pending job the caller may release."""
        return await self._control(user, req.job_ids, release=True)

    async def _control(self, user: str, job_ids: list[int], *, release: bool) -> api.ControlReply:
        if len(job_ids) > MAX_CANCEL:
            raise InvalidInput(f"at most {MAX_CANCEL} jobs per request", field="job_ids")
        outcomes = []
        for job_id in job_ids:
            error = await self._control_one(user, job_id, release)
            outcomes.append(api.JobOutcome(job_id=job_id, error=error))
        return api.ControlReply(outcomes=outcomes)

    async def _control_one(self, user: str, job_id: int, release: bool) -> str | None:
        checked = await self._pending(user, job_id)
        if isinstance(checked, str):
            return checked
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
        await self.bus.append(intent, correlation_id=str(job_id), traceparent=checked[1].meta.traceparent)
        return None

    async def _pending(self, user: str, job_id: int) -> tuple[ev.JobSubmitted, ev.Envelope] | str:
        """A job's submission if the caller may change it and it is still pending; Slurm's refusal if not."""
        found = await self._submission(job_id)
        if found is None:
            return control.INVALID_JOB
        if found[0].user != user and user not in self.admins:
            return control.DENIED
        latest = await self.bus.last_entry(subjects.job_events(job_id))
        problem = control.phase_problem(latest.envelope.body if latest and latest.envelope else None)
        return found if problem is None else problem

    async def update(self, user: str, req: api.UpdateRequest) -> api.ControlReply:
        """Append JobUpdateRequested for a pending job the caller may change (scontrol update JobId=)."""
        if req.time_limit_s is None and req.partition is None:
            raise InvalidInput("nothing to update: give TimeLimit= or Partition=", field="job_id")
        error = await self._update_one(user, req)
        return api.ControlReply(outcomes=[api.JobOutcome(job_id=req.job_id, error=error)])

    async def _update_one(self, user: str, req: api.UpdateRequest) -> str | None:
        checked = await self._pending(user, req.job_id)
        if isinstance(checked, str):
            return checked
        submitted, envelope = checked
        admin = user in self.admins
        current = control.current_spec(submitted.spec, await self._last(req.job_id, "job_updated"))
        changed = msgspec.structs.replace(
            current,
            time_limit_s=req.time_limit_s if req.time_limit_s is not None else current.time_limit_s,
            partition=req.partition if req.partition is not None else current.partition,
        )
        validate_spec(changed, self.config)
        # As in Slurm, only an admin may raise a time limit.
        if not admin and req.time_limit_s is not None and req.time_limit_s > self._limit(current):
            return control.DENIED
        await self.bus.append(
            ev.JobUpdateRequested(
                job_id=ev.JobId(req.job_id),
                user=user,
                admin=admin,
                time_limit_s=req.time_limit_s,
                partition=req.partition,
            ),
            correlation_id=str(req.job_id),
            traceparent=envelope.meta.traceparent,
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
        entry = await self.bus.last_entry(subjects.job_subject(job_id, tag))
        if entry is None or entry.envelope is None:
            return None
        return entry.seq, entry.envelope.body

    async def cancel(self, user: str, req: api.CancelRequest) -> api.CancelReply:
        """Append JobCancelRequested for each job the caller may cancel."""
        if len(req.job_ids) > MAX_CANCEL:
            raise InvalidInput(f"at most {MAX_CANCEL} jobs per request", field="job_ids")
        outcomes = []
        for job_id in req.job_ids:
            outcomes.append(api.CancelOutcome(job_id=job_id, error=await self._cancel_one(user, job_id)))
        return api.CancelReply(outcomes=outcomes)

    async def _cancel_one(self, user: str, job_id: int) -> str | None:
        found = await self._submission(job_id)
        if found is None:
            return control.INVALID_JOB
        submitted, envelope = found
        if submitted.user != user and user not in self.admins:
            raise Forbidden(f"Access/permission denied: job {job_id} belongs to {submitted.user}")
        await self.bus.append(
            ev.JobCancelRequested(job_id=ev.JobId(job_id), user=user),
            correlation_id=str(job_id),
            traceparent=envelope.meta.traceparent,
        )
        return None


async def main(ctx: Context) -> None:
    """Serve until stopped."""
    gateway = Gateway(ctx.bus, ctx.config, admins=frozenset(ctx.args.admin or []))
    subs = [
        await serve(ctx.nc, "submit", api.SubmitRequest, gateway.submit, queue="gateway"),
        await serve(ctx.nc, "cancel", api.CancelRequest, gateway.cancel, queue="gateway"),
        await serve(ctx.nc, "hold", api.HoldRequest, gateway.hold, queue="gateway"),
        await serve(ctx.nc, "release", api.ReleaseRequest, gateway.release, queue="gateway"),
        await serve(ctx.nc, "update", api.UpdateRequest, gateway.update, queue="gateway"),
    ]
    await ctx.stop.wait()
    for sub in subs:
        await sub.unsubscribe()
