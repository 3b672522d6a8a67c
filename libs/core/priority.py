"""Multifactor job priority (Slurm's priority/multifactor), pure.

    priority = w_age * age + w_fairshare * fairshare + w_size * size + w_partition * tier + w_qos * qos - nice

each factor in [0, 1]: ``age`` grows linearly to 1 at ``max_age``; ``size`` is the job's share of
the cluster's GPUs (or CPUs for CPU jobs), inverted when ``favor_small``; ``tier`` is the
partition's PriorityJobFactor relative to the highest; ``fairshare`` is the user association's
fair-share factor (``share_factors.py``: Fair Tree or classic); ``qos`` is the job's QOS priority relative
to the highest QOS priority; ``nice`` is the job's ``--nice`` (only an admin may give a negative one),
subtracted unweighted as in Slurm, and the result is at least 1. With every weight 0 and no nice (the
default, like Slurm's priority/basic) all jobs have priority 1 and the queue is FIFO.

``factors`` gives the breakdown ``sprio`` shows: each factor already multiplied by its weight, in an
``api.PriorityFactors`` with a field per Slurm factor (SITE, AGE, FAIRSHARE, JOBSIZE, PARTITION, QOS,
NICE); the priority is their sum (NICE, the job's nice value, subtracted), at least 1. SITE is always 0
(Corral has no site factor); QOS is PriorityWeightQOS x the job's QOS priority over the highest.
An admin's ``scontrol update Priority=`` replaces the sum (``Job.priority_override``).

Queue order (``queue_order``, the order the cycle considers pending jobs in) is a comparator chain ending
in a deterministic tie-break: partition PriorityTier (higher first), priority (higher first), submit time,
job id.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple

from corral.libs.core.fair_share import tree_of, user_key
from corral.libs.core.limits import qos_of
from corral.libs.core.share_factors import classic_factors, fair_tree_factors
from corral.libs.core.state import Job, State
from corral.schemas.api import PriorityFactors

if TYPE_CHECKING:
    from corral.libs.core.job_facts import FactsCache
    from corral.libs.core.policy import Policy


@dataclass(frozen=True)
class PriorityWeights:
    """Weights of the priority factors (Slurm's PriorityWeight*)."""

    age: int = 0  # PriorityWeightAge
    fairshare: int = 0  # PriorityWeightFairshare
    job_size: int = 0  # PriorityWeightJobSize
    partition: int = 0  # PriorityWeightPartition
    max_age_s: float = 7 * 86400.0  # PriorityMaxAge
    favor_small: bool = False  # PriorityFavorSmall
    qos: int = 0  # PriorityWeightQOS


class ClusterSize(NamedTuple):
    """Totals the size factor is relative to (a tuple: compared at each job of each cycle)."""

    gpus: int  # GPUs in the cluster
    cpus: int  # CPUs in the cluster


def _age(job: Job, now: float, weights: PriorityWeights) -> float:
    """The age factor: time pending over PriorityMaxAge, at most 1."""
    return min(max(now - job.submit_time, 0.0) / weights.max_age_s, 1.0) if weights.max_age_s > 0 else 1.0


def _size_factor(job: Job, weights: PriorityWeights, size: ClusterSize) -> float:
    """The job size factor: its share of the cluster's GPUs (CPUs for a CPU job), inverted to favor small."""
    spec = job.spec
    if spec.gpus_per_node > 0 and size.gpus > 0:
        share = min(spec.gpus_per_node * spec.nodes / size.gpus, 1.0)
    else:
        share = min(spec.ntasks * spec.cpus_per_task / max(size.cpus, 1), 1.0)
    return 1.0 - share if weights.favor_small else share


def total(parts: PriorityFactors) -> int:
    """The priority the factors add up to (NICE subtracted), at least 1."""
    first = parts.site + parts.age
    return _summed(first, parts.fairshare, parts.job_size, parts.partition, parts.qos, parts.nice)


def _summed(
    first: float, fairshare: float, job_size: float, partition: float, qos: float, nice: float
) -> int:
    """``total``'s sum, in its order (floating-point addition is not associative): SITE + AGE first."""
    return max(int(first + fairshare + job_size + partition + qos - nice), 1)


class Steady(NamedTuple):
    """A pending job's weighted factors that do not move with time, nor with usage: all but AGE and
    FAIRSHARE, and the key of its fair-share association (kept per job across cycles, ``job_facts.py``)."""

    job_size: float  # JOBSIZE
    partition: float  # PARTITION
    qos: float  # QOS
    nice: float  # NICE
    association: str  # its user association's key (``fair_share.user_key``)


class Ranking:
    """What every pending job's priority at one time shares: the cluster's size, the top tier, the fair-share
    factors of the pending jobs' users (``priority_factors``'s, once)."""

    def __init__(self, state: State, now: float, policy: Policy, pending: list[Job]) -> None:
        self.now, self.policy, self.weights = now, policy, policy.weights
        self.size = ClusterSize(
            gpus=sum(n.gpus for n in state.nodes.values()), cpus=sum(n.cpus for n in state.nodes.values())
        )
        self.top_tier = max((p.tier for p in policy.partitions), default=1) or 1
        self.tiers = {p.name: p.tier for p in policy.partitions}
        self.shares: dict[str, float] = {}
        # The pending jobs' associations only (``share_factors.py``, "Cost").
        if policy.weights.fairshare > 0:
            users = {job.user for job in pending}
            wanted = {user_key(job.user, job.spec.account or job.user) for job in pending}
            self.shares = fairshare_factors(state, now, policy, users, wanted)

    def steady(self, job: Job) -> Steady:
        """The job's factors that depend on its spec, the policy and the cluster's size alone."""
        policy, w = self.policy, self.weights
        tier = self.tiers.get(policy.partition_of(job), 1)
        qos = qos_of(policy, job).priority / policy.top_qos_priority if policy.top_qos_priority > 0 else 0.0
        return Steady(
            job_size=w.job_size * _size_factor(job, w, self.size),
            partition=w.partition * (tier / self.top_tier),
            qos=w.qos * qos,
            nice=float(job.spec.nice),
            association=user_key(job.user, job.spec.account or job.user),
        )

    def factors(self, job: Job) -> PriorityFactors:
        """The job's weighted priority factors now (what ``sprio`` shows)."""
        steady, w = self.steady(job), self.weights
        fs = self.shares.get(steady.association, 0.0)
        return PriorityFactors(
            age=w.age * _age(job, self.now, w),
            fairshare=w.fairshare * fs,
            job_size=steady.job_size,
            partition=steady.partition,
            qos=steady.qos,
            nice=steady.nice,
        )

    def priority(self, job: Job, steady: Steady) -> int:
        """The job's computed priority now, from its ``steady`` factors: ``total(self.factors(job))``."""
        w = self.weights
        fairshare = w.fairshare * self.shares.get(steady.association, 0.0)
        age = 0.0 + w.age * _age(job, self.now, w)  # (SITE, always 0, first)
        return _summed(age, fairshare, steady.job_size, steady.partition, steady.qos, steady.nice)


#: A job's ``--nice`` (in C: asked of every pending job in every cycle).
_NICE = attrgetter("spec.nice")


def queue_order(
    state: State, now: float, policy: Policy, pending: list[Job], facts: FactsCache | None = None
) -> list[tuple[Job, int]]:
    """Pending jobs with their priority, in the order they are considered.

    A job's priority is its admin-set one (``scontrol update Priority=``) when it has one, else the
    sum of its weighted factors (``priority_factors``); with every weight 0 it is 1 for all. ``facts``: each
    job's factors that do not move with time or usage (``Steady``) kept from one cycle to the next, so that a
    cycle computes only AGE and FAIRSHARE anew (the same values).
    """
    tiers = {p.name: p.tier for p in policy.partitions}
    computed: dict[int, int] = {}
    if weighted(policy, pending):
        ranking = Ranking(state, now, policy, pending)
        if facts is None:
            computed = {job.job_id: ranking.priority(job, ranking.steady(job)) for job in pending}
        else:
            computed = {job.job_id: ranking.priority(job, facts.steady(job, ranking)) for job in pending}
    # Every job's tier is 1 unless a partition has another (a job of an unknown partition has tier 1).
    tiered = any(t != 1 for t in tiers.values())
    ranked = []
    for job in pending:
        tier = tiers.get(policy.partition_of(job), 1) if tiered else 1
        value = job.priority_override
        if value is None:
            value = computed.get(job.job_id, 1)
        # Sorted as tuples: the job ids differ, so the comparison never reaches the job.
        ranked.append((-tier, -value, job.submit_time, job.job_id, job, value))
    ranked.sort()
    return [(r[4], r[5]) for r in ranked]


def weighted(policy: Policy, pending: list[Job]) -> bool:
    """Whether the pending jobs' priorities are computed: a weight counts, or one of them has a ``--nice``
    (else every job's is 1, and the queue is FIFO)."""
    w = policy.weights
    return bool(w.age or w.fairshare or w.job_size or w.partition or w.qos or any(map(_NICE, pending)))


def value(job: Job, factors: PriorityFactors, computed: bool) -> int:
    """The priority the job is ranked with (``queue_order``'s): its admin-set one when it has one, else its
    ``factors``' total if priorities are ``computed`` (``weighted``), else 1."""
    if job.priority_override is not None:
        return job.priority_override
    return total(factors) if computed else 1


def priority_factors(
    state: State, now: float, policy: Policy, pending: list[Job]
) -> dict[int, PriorityFactors]:
    """The weighted factors of each pending job's computed priority (what ``sprio`` shows), by id."""
    ranking = Ranking(state, now, policy, pending)
    return {job.job_id: ranking.factors(job) for job in pending}


def fairshare_factors(
    state: State, now: float, policy: Policy, users: set[str], wanted: Collection[str] | None = None
) -> dict[str, float]:
    """Fair-share factor of every user association in the tree of ``policy`` and ``users`` (those of the
    ``wanted`` association keys only, when given); only computed when its weight counts."""
    if policy.weights.fairshare <= 0:
        return {}
    tree = tree_of(policy.accounts, policy.associations, users)
    compute = fair_tree_factors if policy.fairshare == "fair_tree" else classic_factors
    return compute(tree, state.usage, now, state.usage_policy.half_life_s, wanted)
