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

Queue order is a comparator chain ending in a deterministic tie-break: partition PriorityTier
(higher first), priority (higher first), submit time, job id.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.libs.core.state import Job
from corral.schemas.api import PriorityFactors


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


def priority(
    job: Job,
    now: float,
    weights: PriorityWeights,
    size: ClusterSize,
    tier_factor: float,
    fairshare: float = 0.0,
    qos_factor: float = 0.0,
) -> int:
    """The job's priority value at ``now`` (higher runs first)."""
    return total(factors(job, now, weights, size, tier_factor, fairshare, qos_factor))
