"""The scheduler's query verbs (squeue, sbatch --test-only, sinfo, scontrol show reservation, sprio, sshare,
scontrol ping), answered from its state by leader and standbys alike (``process.py`` serves them). Pending
reasons and planned starts come from the leader's latest cycle, or on a standby from a plan made for the
answer (``view``: the same pure plan on the same log, at most once per log position and second)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from corral.libs.config.cluster import ClusterConfig
from corral.libs.core import plan as planner
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.policy import Policy
from corral.libs.core.state import State
from corral.libs.core.will_run import will_run
from corral.libs.infra import roles
from corral.libs.runtime.errors import Forbidden, TransientError
from corral.libs.runtime.kv_lease import TRANSIENT
from corral.schemas import api
from corral.services.scheduler import priority_views, views
from corral.services.scheduler.leadership import Leadership
from corral.services.scheduler.owners import Owners
from corral.services.scheduler.planning import plan_paused

T = TypeVar("T")


class QueryVerbs:
    """The queries of a ``Scheduler`` (its state, plan and lease are the attributes below)."""

    state: State
    config: ClusterConfig
    policy: Policy
    will_run_policy: Policy
    outlook: planner.Plan
    capacity: CapacityCache
    leader: Leadership | None
    _standby_view: tuple[int, int, planner.Plan] | None
    owners: Owners
    order: views.JobOrder  # the state's job ids in order, for squeue's pages
    testing = False  # an ``sbatch --test-only`` is being planned (``will_run``: one at a time)

    @property
    def epoch(self) -> int:
        raise NotImplementedError  # the Scheduler's

    def leading(self) -> bool:
        raise NotImplementedError  # the Scheduler's

    async def aside(self, fn: Callable[..., T], *args: object) -> T:
        raise NotImplementedError  # the Scheduler's

    async def view(self, now: float) -> planner.Plan:
        """The reasons, priorities and planned starts a query shows: the leader's latest cycle; on a
        standby (which makes no cycle) a plan of the state made now, kept for the same log position and
        second. It decides nothing: nothing of it is published. The standby's plan runs in the planning
        thread, as the leader's does (seconds for a deep queue: its loop, its lease polls among them, goes
        on); that one thread also keeps the kept capacity to one plan at a time."""
        if self.leading():
            return self.outlook
        key = (self.state.last_seq, int(now))
        if self._standby_view is None or self._standby_view[:2] != key:
            args = (self.state, now, self.policy, self.epoch, self.capacity)
            self._standby_view = (*key, await self.aside(plan_paused, *args))
        return self._standby_view[2]

    async def jobs(self, user: str, req: api.JobsRequest) -> api.JobsReply:
        """squeue."""
        now = time.time()
        outlook = await self.view(now)
        return views.jobs_reply(self.state, outlook, self.policy, req, now, self.owners, self.order)

    async def will_run(self, user: str, req: api.WillRunRequest) -> api.WillRunReply:
        """sbatch --test-only, asked by the gateway once it validated the job: plan it hypothetically.

        A conservative plan of the queue up to the job (seconds on a big cluster: 28 s on 10,000 nodes with
        100,000 pending jobs), in the planning thread with the fold held back, as the leader's plan. One at
        a time: another asked meanwhile is refused at once (retryable) rather than queued, since queued ones
        would hold the fold and the leader's next plan back for as long as they all take (and their callers
        stop waiting after ``JOBS_TIMEOUT_S``)."""
        if user != roles.GATEWAY:
            raise Forbidden("Access/permission denied: use sbatch --test-only")
        if self.testing:
            raise TransientError(
                "the scheduler is planning another sbatch --test-only (one at a time); try again in a moment"
            )
        self.testing = True
        try:
            args = (self.state, time.time(), self.will_run_policy, req.user, req.spec)
            got = await self.aside(will_run, *args)
        finally:
            self.testing = False
        return api.WillRunReply(
            job_id=got.job_id,
            start=got.start,
            nodes=got.nodes,
            cpus=got.cpus,
            partition=req.spec.partition or "",
            reason=got.reason,
        )

    async def nodes(self, user: str, req: api.NodesRequest) -> api.NodesReply:
        """sinfo."""
        return views.nodes_reply(self.state, self.config, req, time.time())

    async def reservations(self, user: str, req: api.ReservationsRequest) -> api.ReservationsReply:
        """scontrol show reservation."""
        return views.reservations_reply(self.state, req, time.time())

    async def live_counts(self, user: str, req: api.LiveCountsRequest) -> api.LiveCountsReply:
        """The gateway's MaxSubmitJobs count: a user's live jobs by QOS and account."""
        return views.live_counts_reply(self.state, self.policy, req, self.owners)

    async def priority(self, user: str, req: api.PriorityRequest) -> api.PriorityReply:
        """sprio."""
        return priority_views.priority_reply(self.state, self.policy, req, time.time())

    async def ping(self, user: str, req: api.PingRequest) -> api.PingReply:
        """scontrol ping: every scheduler answers, from the leader bucket (unavailable while JetStream elects
        the bucket's leader: a retryable error, which another scheduler's answer may beat)."""
        if self.leader is None:
            return api.PingReply(controllers=[api.ControllerInfo(name="scheduler", role="primary", up=True)])
        try:
            lines = await self.leader.roster()
        except TRANSIENT as exc:
            raise TransientError(f"the schedulers' lease bucket is unavailable ({exc!r}); try again") from exc
        return api.PingReply(
            controllers=[api.ControllerInfo(name=name, role=role, up=up) for name, role, up in lines]
        )

    async def shares(self, user: str, req: api.SharesRequest) -> api.SharesReply:
        """sshare."""
        return priority_views.shares_reply(self.state, self.policy, req, user, time.time())
