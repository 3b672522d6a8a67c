"""The scheduling policy of a cluster configuration: ``policy_of`` and ``usage_policy_of`` (pure).

The planner (``libs/core/plan.py``) takes a ``Policy`` (``libs/core/policy.py``) and the fold bills
usage by the state's ``UsagePolicy``; both are configuration, not log. They are built here, once for
everyone who runs the core on a configured cluster: the scheduler service and the simulator (``corral sim
--config``), so a simulation plans with exactly the service's policy. Not in ``libs/core``: the core knows
no configuration file, only the values it is given.
"""

from __future__ import annotations

from typing import cast

from corral.libs.config.cluster import ClusterConfig
from corral.libs.core.fair_share import Account, TresWeights, UserAssoc
from corral.libs.core.policy import Backfill, FairShareAlgorithm, PartitionPolicy, Policy
from corral.libs.core.preempt import PartitionPreemptMode, PreemptPolicy, PreemptType
from corral.libs.core.priority import PriorityWeights
from corral.libs.core.state import State, UsagePolicy
from corral.schemas.events import PreemptMode


def usage_policy_of(config: ClusterConfig) -> UsagePolicy:
    """How the fold bills runs, from the configuration."""
    sched = config.scheduler
    return UsagePolicy(
        half_life_s=float(sched.half_life_s),
        weights=TresWeights(cpu=sched.billing_cpu, gpu=sched.billing_gpu, mem_per_gb=sched.billing_mem_gb),
    )


def scheduler_state(config: ClusterConfig) -> State:
    """The empty state the scheduler folds the log into: the fold's parameters from the configuration (how
    runs are billed, when ended jobs are forgotten)."""
    return State(usage_policy=usage_policy_of(config), min_job_age_s=float(config.scheduler.min_job_age_s))


def policy_of(config: ClusterConfig) -> Policy:
    """The planner's policy from the cluster configuration."""
    sched = config.scheduler
    return Policy(
        partitions=tuple(
            PartitionPolicy(
                p.name,
                p is config.default_partition,
                p.max_time_s,
                p.default_time_s,
                p.priority_tier,
                cast(PartitionPreemptMode | None, p.preempt_mode),
                p.grace_time_s,
                qos=p.qos,
                max_nodes=p.max_nodes,
                size=len(p.nodes),
            )
            for p in config.partitions
        ),
        cluster=config.name,
        backfill=cast(Backfill, sched.backfill),
        backfill_window_s=sched.backfill_window_s,
        backfill_resolution_s=sched.backfill_resolution_s,
        backfill_depth=sched.backfill_depth,
        accounts=tuple(Account(a.name, a.parent, a.shares) for a in config.accounts),
        associations=tuple(UserAssoc(u, a.name) for a in config.accounts for u in a.users),
        fairshare=cast(FairShareAlgorithm, sched.fairshare),
        weights=PriorityWeights(
            age=sched.weight_age,
            fairshare=sched.weight_fairshare,
            job_size=sched.weight_job_size,
            partition=sched.weight_partition,
            max_age_s=float(sched.max_age_s),
            favor_small=sched.favor_small,
            qos=sched.weight_qos,
        ),
        preempt=PreemptPolicy(
            preempt_type=cast(PreemptType, sched.preempt_type),
            preempt_mode=cast(PreemptMode, sched.preempt_mode),
            grace_time_s=sched.preempt_grace_time_s,
        ),
        qos=config.qos,
        default_qos=sched.default_qos,
        account_limits=tuple(a.limits for a in config.accounts if a.limits is not None),
        blocks=config.block_map(),
        max_switch_wait_s=sched.max_switch_wait_s,
    )
