"""Multifactor job priority (Slurm's priority/multifactor), pure.

    priority = w_age * age + w_fairshare * fairshare + w_size * size + w_partition * tier + w_qos * qos - nice

each factor in [0, 1]: ``age`` grows linearly to 1 at ``max_age``; ``size`` is the job's share of
the cluster's GPUs (or CPUs for CPU jobs), inverted when ``favor_small``; ``tier`` is the
partition's PriorityJobFactor relative to the highest; ``fairshare`` is the user association's
fair-share factor (``fair_share.py``: Fair Tree or classic); ``qos`` is the job's QOS priority relative
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

from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING

from corral.libs.core.fair_share import build_tree, classic_factors, fair_tree_factors, user_key
from corral.libs.core.limits import qos_of
from corral.libs.core.state import Job, State
from corral.schemas.api import PriorityFactors

if TYPE_CHECKING:
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


@dataclass(frozen=True)
class ClusterSize:
    """Totals the size factor is relative to."""

    gpus: int  # GPUs in the cluster
    cpus: int  # CPUs in the cluster


def factors(
    job: Job,
    now: float,
    weights: PriorityWeights,
    size: ClusterSize,
    tier_factor: float,
    fairshare: float = 0.0,
    qos_factor: float = 0.0,
) -> PriorityFactors:
    """The job's weighted priority factors at ``now``."""
    spec = job.spec
    age = min(max(now - job.submit_time, 0.0) / weights.max_age_s, 1.0) if weights.max_age_s > 0 else 1.0
    if spec.gpus_per_node > 0 and size.gpus > 0:
        share = min(spec.gpus_per_node * spec.nodes / size.gpus, 1.0)
    else:
        share = min(spec.ntasks * spec.cpus_per_task / max(size.cpus, 1), 1.0)
    size_factor = 1.0 - share if weights.favor_small else share
    return PriorityFactors(
        age=weights.age * age,
        fairshare=weights.fairshare * fairshare,
        job_size=weights.job_size * size_factor,
        partition=weights.partition * tier_factor,
        qos=weights.qos * qos_factor,
        nice=float(spec.nice),
    )


def total(parts: PriorityFactors) -> int:
    """The priority the factors add up to (NICE subtracted), at least 1."""
    value = parts.site + parts.age + parts.fairshare + parts.job_size + parts.partition + parts.qos
    return max(int(value - parts.nice), 1)


#: A job's ``--nice`` (in C: asked of every pending job in every cycle).
_NICE = attrgetter("spec.nice")


def queue_order(state: State, now: float, policy: Policy, pending: list[Job]) -> list[tuple[Job, int]]:
    """Pending jobs with their priority, in the order they are considered.

    A job's priority is its admin-set one (``scontrol update Priority=``) when it has one, else the
    sum of its weighted factors (``priority_factors``); with every weight 0 it is 1 for all.
    """
    tiers = {p.name: p.tier for p in policy.partitions}
    w = policy.weights
    computed: dict[int, int] = {}
    if w.age or w.fairshare or w.job_size or w.partition or w.qos or any(map(_NICE, pending)):
        computed = {job_id: total(f) for job_id, f in priority_factors(state, now, policy, pending).items()}
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


def priority_factors(
    state: State, now: float, policy: Policy, pending: list[Job]
) -> dict[int, PriorityFactors]:
    """The weighted factors of each pending job's computed priority (what ``sprio`` shows), by id."""
    size = ClusterSize(
        gpus=sum(n.gpus for n in state.nodes.values()), cpus=sum(n.cpus for n in state.nodes.values())
    )
    top_tier = max((p.tier for p in policy.partitions), default=1) or 1
    tiers = {p.name: p.tier for p in policy.partitions}
    shares = fairshare_factors(state, now, policy, {job.user for job in pending})
    out = {}
    for job in pending:
        tier = tiers.get(policy.partition_of(job), 1)
        fs = shares.get(user_key(job.user, job.spec.account or job.user), 0.0)
        qos = qos_of(policy, job).priority / policy.top_qos_priority if policy.top_qos_priority > 0 else 0.0
        out[job.job_id] = factors(job, now, policy.weights, size, tier / top_tier, fs, qos)
    return out


def fairshare_factors(state: State, now: float, policy: Policy, users: set[str]) -> dict[str, float]:
    """Fair-share factor of every user association (only computed when its weight counts)."""
    if policy.weights.fairshare <= 0:
        return {}
    tree = build_tree(policy.accounts, policy.associations, sorted(users))
    compute = fair_tree_factors if policy.fairshare == "fair_tree" else classic_factors
    return compute(tree, state.usage, now, state.usage_policy.half_life_s)
