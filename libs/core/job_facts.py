"""What the cycle asks of a pending job that depends only on its spec and the policy (``Facts``), kept from
one cycle to the next.

``Cycle.consider`` asks the same questions of every pending job in every cycle: its partition, its request
(``placement.request_of``), its effective time limit, whether it is over its partition's limits, its
array's ``%P``. Their answers change only when the job's spec does (the fold replaces a job's spec, a frozen
struct, whenever it changes it: ``scontrol update``) or the policy does, so ``FactsCache`` keeps them by job,
with the spec and the policy they were computed from, and computes them again when either is another object.
Everything that depends on the state or on ``now`` (held, dependencies, begin time, limits, the nodes a job
names, ``--switches`` lapsing) is still asked in each cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from corral.libs.core.eligibility import spec_needs_check
from corral.libs.core.placement import Request, request_of
from corral.libs.core.priority import ClusterSize, Ranking, Steady
from corral.libs.core.reasons import PendingReason
from corral.libs.core.state import Job, array_throttle
from corral.libs.core.timeline import INF, span
from corral.schemas.events import JobSpec

if TYPE_CHECKING:
    from corral.libs.core.policy import Policy


class Facts(msgspec.Struct, gc=False):
    """A pending job's answers that depend only on its spec and the policy (``placed`` fills in the rest
    the first time the job gets through the gates: most jobs of a long queue never do in a cycle)."""

    spec: JobSpec  # the spec they were computed from
    partition: str  # the partition it runs in (``Policy.partition_of``)
    over_partition: PendingReason | None  # the partition limit it is over (``partition_limits``), or None
    throttle: int  # its array's ``%P`` (``state.array_throttle``; 0: none)
    # No gate but a hold, a limit and FIFO's ``behind_blocked`` can stop it: no dependency or begin time,
    # within its partition's limits, no ``%P``, no ``-w`` (``Cycle.consider`` skips the others' calls).
    plain: bool
    req: Request | None = None  # what one node of it needs (``request_of``; ``--switches`` as asked)
    limit_s: int | None = None  # its effective time limit (``Policy.time_limit``), once ``req`` is set
    # (partition, req, the time limit as the plan counts it: ``timeline.span``), once ``req`` is set
    shape: tuple[str, Request, float] | None = None
    # ``shape`` with ``limit_s``: the key of ``plan.Cycle.refused`` (once ``req`` is set; None for a job with
    # ``--switches``, whose request changes as its wait goes on, or one that asks for an advance reservation)
    refusal: tuple[str, Request, float, int | None] | None = None
    steady: Steady | None = None  # its priority factors that do not move (``priority.Ranking.steady``)
    size: ClusterSize | None = None  # the cluster's size ``steady`` was computed for (JOBSIZE depends on it)

    def placed(self, job: Job, policy: Policy) -> tuple[str, Request, float]:
        """Its partition, request and time limit as the plan counts it, with its effective time limit in
        ``limit_s`` (computed on first use)."""
        if self.shape is None:
            self.req, self.limit_s = request_of(job), policy.time_limit(job)
            limit = INF if self.limit_s is None else span(float(self.limit_s), policy.backfill_resolution_s)
            self.shape = (self.partition, self.req, limit)
            if self.req.switches is None and job.spec.reservation is None:
                self.refusal = (*self.shape, self.limit_s)
        return self.shape


def facts_of(job: Job, policy: Policy) -> Facts:
    """A job's ``Facts`` under ``policy``, computed."""
    spec, partition = job.spec, policy.partition_of(job)
    over, throttle = partition_limits(policy, job, partition), array_throttle(job)
    plain = not spec_needs_check(spec) and over is None and not throttle and not spec.nodelist
    return Facts(spec, partition, over, throttle, plain)


def partition_limits(policy: Policy, job: Job, partition: str) -> PendingReason | None:
    """Over its partition's MaxNodes, MaxTime or node count: accepted by a gateway with
    ``enforce_part_limits = NO`` (Slurm's default), or submitted before the partition shrank. It waits with
    Slurm's reason and blocks nobody."""
    part = policy.by_name.get(partition)
    if part is None:
        return None
    nodes, limit = job.spec.nodes, job.spec.time_limit_s
    if part.max_nodes is not None and nodes > part.max_nodes:
        return "PartitionNodeLimit"
    if limit is not None and part.max_time_s is not None and limit > part.max_time_s:
        return "PartitionTimeLimit"
    if part.size is not None and nodes > part.size:
        return "PartitionConfig"
    return None


class FactsCache:
    """Each job's ``Facts`` as last computed (by job id), for one policy at a time."""

    def __init__(self) -> None:
        self._facts: dict[int, Facts] = {}
        self._policy: Policy | None = None  # the policy they were computed under

    def of(self, job: Job, policy: Policy) -> Facts:
        """``facts_of(job, policy)``, computed again only if the job's spec or the policy is another one."""
        if policy is not self._policy:
            self._facts.clear()
            self._policy = policy
        facts = self._facts.get(job.job_id)
        if facts is None or facts.spec is not job.spec:
            facts = self._facts[job.job_id] = facts_of(job, policy)
        return facts

    def steady(self, job: Job, ranking: Ranking) -> Steady:
        """``ranking.steady(job)``, computed again only if the job's spec, the policy or the cluster's size
        is another."""
        facts = self.of(job, ranking.policy)
        if facts.steady is None or facts.size != ranking.size:
            facts.steady, facts.size = ranking.steady(job), ranking.size
        return facts.steady

    def keep(self, jobs: int) -> None:
        """Forget every job's facts once far more are kept than ``jobs`` (the jobs still active)."""
        if len(self._facts) > 2 * jobs + 1024:
            self._facts.clear()
