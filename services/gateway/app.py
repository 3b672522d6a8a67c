"""The gateway: accepts submit and cancel requests and appends the accepted ones as intents.

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
from corral.services.gateway.validate import validate_spec

MAX_TOKEN = 128
MAX_CANCEL = 10_000
_tracer = telemetry.tracer(__name__)


class Gateway:
    """Submit and cancel on ``corral.api.v1.{submit,cancel}.<user>``."""

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

    async def cancel(self, user: str, req: api.CancelRequest) -> api.CancelReply:
        """Append JobCancelRequested for each job the caller may cancel."""
        if len(req.job_ids) > MAX_CANCEL:
            raise InvalidInput(f"at most {MAX_CANCEL} jobs per request", field="job_ids")
        outcomes = []
        for job_id in req.job_ids:
            outcomes.append(api.CancelOutcome(job_id=job_id, error=await self._cancel_one(user, job_id)))
        return api.CancelReply(outcomes=outcomes)

    async def _cancel_one(self, user: str, job_id: int) -> str | None:
        if job_id < 1:
            return "Invalid job id specified"
        submitted = await self.bus.last_entry(subjects.job_subject(job_id, "job_submitted"))
        if submitted is None or submitted.envelope is None:
            return "Invalid job id specified"
        body = submitted.envelope.body
        assert isinstance(body, ev.JobSubmitted)
        if body.user != user and user not in self.admins:
            raise Forbidden(f"Access/permission denied: job {job_id} belongs to {body.user}")
        await self.bus.append(
            ev.JobCancelRequested(job_id=ev.JobId(job_id), user=user),
            correlation_id=str(job_id),
            traceparent=submitted.envelope.meta.traceparent,
        )
        return None


async def main(ctx: Context) -> None:
    """Serve until stopped."""
    gateway = Gateway(ctx.bus, ctx.config, admins=frozenset(ctx.args.admin or []))
    subs = [
        await serve(ctx.nc, "submit", api.SubmitRequest, gateway.submit, queue="gateway"),
        await serve(ctx.nc, "cancel", api.CancelRequest, gateway.cancel, queue="gateway"),
    ]
    await ctx.stop.wait()
    for sub in subs:
        await sub.unsubscribe()
