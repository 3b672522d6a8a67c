"""What the gateway asks the scheduler at submission: the count of the user's live jobs (MaxSubmitJobs) and,
for ``sbatch --test-only``, the estimated start of a job. Through the ``ApiClient`` port, as the gateway."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from corral.libs.runtime.errors import TransientError
from corral.libs.runtime.ports import ApiClient
from corral.schemas import api
from corral.schemas import events as ev
from corral.schemas.codec import DecodeError, decode, encode
from corral.services.gateway.policy import Counted

#: How long a submission waits for the scheduler's answer.
JOBS_TIMEOUT_S = 5.0
R = TypeVar("R", bound=msgspec.Struct)


class SchedulerAsks:
    """The scheduler's verbs the gateway calls; a retryable error when the scheduler does not answer."""

    def __init__(self, scheduler: ApiClient) -> None:
        self.scheduler = scheduler

    async def live_counts(self, user: str) -> list[Counted]:
        """The user's pending and running jobs by QOS and account, from the scheduler (the gateway keeps no
        job state): a few numbers, however many jobs the user has.

        Only asked when a MaxSubmitJobs limit applies. The scheduler's view lags the log by the entries it
        has not folded yet, so a burst of concurrent submissions may overshoot the limit by those in flight.
        """
        request = api.LiveCountsRequest(user=user)
        reply = await self._ask("live_counts", request, api.LiveCountsReply, "cannot check MaxSubmitJobs")
        return [(c.qos, c.account, c.jobs) for c in reply.counts]

    async def will_run(self, user: str, spec: ev.JobSpec) -> api.WillRunReply:
        """sbatch --test-only: the scheduler's estimate for the validated job (nothing is appended)."""
        request = api.WillRunRequest(user=user, spec=spec)
        return await self._ask("will_run", request, api.WillRunReply, "cannot test the job")

    async def _ask(self, verb: str, request: msgspec.Struct, reply_type: type[R], what: str) -> R:
        try:
            data = await self.scheduler.request(verb, encode(request), JOBS_TIMEOUT_S)
            reply = decode(data, reply_type | api.ApiError)
        except (TimeoutError, DecodeError):
            raise TransientError(f"{what}: the scheduler did not answer in time; submit again") from None
        if isinstance(reply, api.ApiError):
            raise TransientError(f"{what}: {reply.error}")
        assert isinstance(reply, reply_type)
        return reply
