"""Submissions: ``submit`` (one job: sbatch) and ``submit_batch`` (many jobs in one request: other systems).

One submission, in order:
1. **accept** (``_accept``): the owner (the caller, or the user a service account submits for: ``behalf.py``),
   the spec validated against the cluster and resolved (default partition, account and QOS), the policy,
   dependencies, MaxSubmitJobs and the reservation; a refusal leaves no trace in the log;
2. **ids**: ``count`` consecutive job ids (an array's whole block) from the ``JobIds`` port; the concurrent
   submissions of a gateway share one compare-and-set of the counter (``libs/runtime/id_blocks.py``);
3. **append** (``_append``) ``JobSubmitted`` with ``Nats-Msg-Id: submit:<caller>:<token>``: a retry with the
   same token is the same entry, and its reply the original job id, read from that entry (the ids the retry
   reserved are skipped). The reply goes only once the log has stored the entry.

A batch accepts each job on its own (a refused job gets its own ``ApiError`` and the others go on; so does a
job that does not decode: the gateway decodes the request as ``RawBatch``, each job separately), reserves the
ids of all the accepted at once, and appends them concurrently: their publishes are pipelined on the
gateway's connection (``libs/runtime/pipeline.py``). Each job's result is what ``submit`` would have replied
for it. Authorisation is the same: every job's owner is the caller, or whom a service account names in that
job's ``on_behalf_of``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from corral.libs.config.cluster import ClusterConfig
from corral.libs.runtime import telemetry
from corral.libs.runtime.api_server import error_reply
from corral.libs.runtime.errors import CorralError, InvalidInput
from corral.libs.runtime.id_blocks import split
from corral.libs.runtime.ports import EventLog, JobIds
from corral.schemas import api
from corral.schemas import events as ev
from corral.schemas.api_requests import MAX_BATCH, MAX_TOKEN
from corral.schemas.codec import DecodeError, decode
from corral.services.gateway.asks import SchedulerAsks
from corral.services.gateway.behalf import owner_of
from corral.services.gateway.lookup import JobLookup
from corral.services.gateway.policy import (
    Counted,
    SubmitLimit,
    check_account,
    check_policy,
    check_submit_count,
    check_submitter,
    resolve_qos,
    submit_limits,
)
from corral.services.gateway.reservations import Reservations
from corral.services.gateway.validate import array_size, validate_spec

#: Slurm's reply to a dependency on a job that does not exist.
DEPENDENCY_PROBLEM = "Job dependency problem"
#: A batch entry asking for an estimate only.
NO_TEST_ONLY = "test_only is not allowed in submit_batch: send it alone as a submit request"
_tracer = telemetry.tracer(__name__)


class RawBatch(msgspec.Struct, frozen=True, tag="submit_batch", kw_only=True):
    """A ``submit_batch`` request as the gateway decodes it (``api.SubmitBatchRequest`` is its schema): each
    job is decoded on its own, so that one that does not decode is refused alone, naming its field."""

    jobs: Annotated[list[msgspec.Raw], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


@dataclass(frozen=True)
class Accepted:
    """A submission that passed every check, ready to append."""

    request: api.SubmitRequest  # as sent
    owner: str  # whose job it is
    service_account: str  # the service account submitting it for ``owner`` ("" for none)
    spec: ev.JobSpec  # resolved: partition, account and QOS as the job gets them

    @property
    def size(self) -> int:
        """The ids it takes (an array's tasks)."""
        return array_size(self.spec)


@dataclass
class Tally:
    """What a batch has accepted so far by owner, so that MaxSubmitJobs counts the batch's own jobs too."""

    live: dict[str, list[Counted]] = field(default_factory=dict)  # the scheduler's answer, asked once
    earlier: dict[str, list[Counted]] = field(default_factory=dict)  # the batch's jobs accepted so far


class Submissions:
    """The submit verbs: validation, ids and the append."""

    def __init__(
        self,
        events: EventLog,
        ids: JobIds,
        asks: SchedulerAsks,
        config: ClusterConfig,
        admins: frozenset[str],
        lookup: JobLookup,
        reservations: Reservations,
    ) -> None:
        self.events = events
        self.ids = ids
        self.asks = asks
        self.config = config
        self.admins = admins
        self.lookup = lookup
        self.reservations = reservations

    async def submit(self, user: str, req: api.SubmitRequest) -> api.SubmitReply | api.WillRunReply:
        """Validate and append JobSubmitted; a retry with the same token returns the same job id.

        A job array is one entry: its block of ids is reserved at once, and the reply is the first id (the
        array's id). With ``test_only`` (sbatch --test-only) the job is validated the same way, nothing is
        appended, and the reply is the scheduler's estimate of its start.
        """
        accepted = await self._accept(user, req)
        if req.test_only:
            return await self.asks.will_run(accepted.owner, accepted.spec)
        return await self._append(user, accepted, await self.ids.next_job_id(accepted.size))

    async def submit_batch(self, user: str, req: RawBatch | api.SubmitBatchRequest) -> api.SubmitBatchReply:
        """Each job of the batch as ``submit`` would take it; one result per job, in order."""
        tally = Tally()
        checked: list[Accepted | api.ApiError] = []
        jobs: list[api.SubmitRequest | msgspec.Raw] = list(req.jobs)
        for k, one in enumerate(jobs):
            try:
                entry = one if isinstance(one, api.SubmitRequest) else _decoded(one, k)
                if entry.test_only:
                    raise InvalidInput(NO_TEST_ONLY, field="test_only")
                checked.append(await self._accept(user, entry, tally))
            except CorralError as exc:
                checked.append(error_reply(exc))
        accepted = [one for one in checked if isinstance(one, Accepted)]
        results: dict[int, api.SubmitReply | api.ApiError] = {}
        try:
            first = await self.ids.next_job_id(sum(a.size for a in accepted)) if accepted else 0
        except CorralError as exc:  # no ids now (JetStream away): every accepted job may be sent again
            results = {id(a): error_reply(exc) for a in accepted}
        else:
            starts = split(first, [a.size for a in accepted])
            appended = await asyncio.gather(
                *(self._append(user, a, start) for a, start in zip(accepted, starts, strict=True)),
                return_exceptions=True,
            )
            for done, outcome in zip(accepted, appended, strict=True):
                results[id(done)] = _result(outcome)
        return api.SubmitBatchReply(
            results=[c if isinstance(c, api.ApiError) else results[id(c)] for c in checked]
        )

    async def _accept(self, caller: str, req: api.SubmitRequest, tally: Tally | None = None) -> Accepted:
        """Every check of a submission by ``caller``; a CorralError names the first that fails."""
        if not req.token or len(req.token) > MAX_TOKEN:
            raise InvalidInput(f"token must be 1-{MAX_TOKEN} characters", field="token")
        owner, service_account = owner_of(caller, req, self.config)
        check_submitter(owner, self.config)
        validate_spec(req.spec, self.config)
        if req.spec.account is not None:
            check_account(req.spec.account, owner, self.config)
        # The log records what the job really gets: the default partition, account and QOS are resolved here.
        spec = msgspec.structs.replace(
            req.spec,
            partition=req.spec.partition or self.config.default_partition.name,
            account=req.spec.account or self.config.default_account(owner),
        )
        spec = msgspec.structs.replace(spec, qos=resolve_qos(spec, self.config))
        # An admin's privileges (a negative nice) are the caller's: a service account never has them, whoever
        # it submits for.
        check_policy(spec, owner, self.config, admin=caller in self.admins)
        await self._check_dependencies(req.spec)
        limits = submit_limits(spec, owner, self.config)
        if limits:
            await self._check_count(limits, owner, spec, tally)
        await self.reservations.check_job(owner, spec)
        return Accepted(req, owner, service_account, spec)

    async def _check_count(
        self, limits: list[SubmitLimit], owner: str, spec: ev.JobSpec, tally: Tally | None
    ) -> None:
        """MaxSubmitJobs: the owner's live jobs, and in a batch the owner's jobs accepted before this one."""
        if tally is None:
            check_submit_count(limits, await self.asks.live_counts(owner), array_size(spec))
            return
        if owner not in tally.live:
            tally.live[owner] = await self.asks.live_counts(owner)
        earlier = tally.earlier.setdefault(owner, [])
        check_submit_count(limits, [*tally.live[owner], *earlier], array_size(spec))
        earlier.append((spec.qos, spec.account, array_size(spec)))

    async def _check_dependencies(self, spec: ev.JobSpec) -> None:
        """Refuse dependencies on jobs that were never submitted, as Slurm does."""
        if spec.dependencies is None:
            return
        for job_id in sorted({d.job_id for d in spec.dependencies.items if d.type != "singleton"}):
            if await self.lookup.find(job_id) is None:
                raise InvalidInput(DEPENDENCY_PROBLEM, field="dependencies")

    async def _append(self, caller: str, accepted: Accepted, job_id: int) -> api.SubmitReply:
        """Append the accepted submission under ``job_id``; the job's id (the original one for a retry)."""
        owner = accepted.owner
        submit = _tracer.start_span("submit", attributes={"enduser.id": owner, "corral.job.id": job_id})
        with telemetry.current(submit):
            traceparent = telemetry.inject()
            with telemetry.about_job(job_id, traceparent):
                appended = await self.events.append(
                    ev.JobSubmitted(
                        job_id=ev.JobId(job_id),
                        user=owner,
                        spec=accepted.spec,
                        service_account=accepted.service_account,
                    ),
                    msg_id=f"submit:{caller}:{accepted.request.token}",
                    correlation_id=str(job_id),
                    traceparent=traceparent,
                )
            if appended.duplicate:
                original = await self.events.entry(appended.seq)
                if original.envelope is None or not isinstance(original.envelope.body, ev.JobSubmitted):
                    raise InvalidInput("token was already used for another request", field="token")
                job_id = original.envelope.body.job_id
            return api.SubmitReply(job_id=job_id)


def _decoded(raw: msgspec.Raw, k: int) -> api.SubmitRequest:
    """Job ``k`` of a batch; InvalidInput naming its field (``jobs[k].spec.nodes``) if it does not decode."""
    try:
        request: api.SubmitRequest = decode(raw, api.SubmitRequest)
    except DecodeError as exc:
        message = str(exc)
        path = message.split("at `$.", 1)[1].split("`", 1)[0] if "at `$." in message else ""
        raise InvalidInput(
            f"malformed job {k}: {message}", field=f"jobs[{k}]{'.' if path else ''}{path}"
        ) from None
    return request


def _result(outcome: api.SubmitReply | BaseException) -> api.SubmitReply | api.ApiError:
    """A batch job's result from its append: its id, or its error as ``submit`` would have replied it."""
    if isinstance(outcome, api.SubmitReply):
        return outcome
    if isinstance(outcome, CorralError):
        return error_reply(outcome)
    if not isinstance(outcome, Exception):
        raise outcome  # cancelled: the gateway is stopping
    telemetry.logger().error("batch submission failed", exc_info=outcome)
    return api.ApiError(error="internal error handling submit_batch; see the service log", code="internal")
