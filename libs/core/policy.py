"""The scheduling policy: what the planner is told that is configuration, not log (pure).

``Policy`` carries the partitions (``PartitionPolicy``), the backfill depth (``Backfill``), the priority
weights and fair-share tree, preemption, QOS and association limits and the topology blocks; it answers
the questions every step of the cycle asks of a job: its partition, its effective time limit, its QOS's
and accounts' settings. It is built from the configuration file in ``libs/config/policy.py`` (the core
knows no file) and passed to ``plan()`` whole; its derived tables are computed once per instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from corral.libs.core import preempt
from corral.libs.core.fair_share import Account, UserAssoc
from corral.libs.core.limits import qos_of
from corral.libs.core.priority import PriorityWeights
from corral.libs.core.qos import NORMAL, AssocLimits, QosPolicy
from corral.libs.core.state import Job

#: Reservation depth of the backfill planner: none (FIFO), the first blocked job per partition (EASY), all.
Backfill = Literal["fifo", "easy", "conservative"]
#: How fair-share factors are computed (``share_factors.py``).
FairShareAlgorithm = Literal["fair_tree", "classic"]


@dataclass(frozen=True)
class PartitionPolicy:
    """What the planner needs to know of a partition."""

    name: str  # name
    default: bool  # the default partition
    max_time_s: int | None  # MaxTime
    default_time_s: int | None  # DefaultTime (None: MaxTime)
    tier: int = 1  # PriorityTier: jobs of higher tiers are considered first
    preempt_mode: preempt.PartitionPreemptMode | None = None  # PreemptMode of its jobs (None: the default)
    grace_time_s: float | None = None  # GraceTime of its preempted jobs (None: the default)
    qos: str | None = None  # the QOS of jobs in the partition without --qos (None: the default QOS)
    max_nodes: int | None = None  # MaxNodes of one job (None: UNLIMITED)
    size: int | None = None  # configured nodes (None: not known, no PartitionConfig check)


@dataclass(frozen=True)
class Policy:
    """Scheduling policy and cluster facts that are configuration, not log."""

    partitions: tuple[PartitionPolicy, ...]  # in config order
    cluster: str = "corral"  # cluster name
    backfill: Backfill = "easy"  # fifo | easy | conservative
    backfill_window_s: int | None = 86400  # how far ahead reservations are planned (Slurm bf_window)
    backfill_resolution_s: int = 0  # bf_resolution: plan run ends on this grid of seconds (0: exact)
    # Conservative backfill: the blocked jobs of a partition given a planned start per cycle, in queue order
    # (``depth``); None: every one, as the textbook algorithm (the configuration's default: 500).
    backfill_depth: int | None = None
    accounts: tuple[Account, ...] = ()  # the fair-share account tree (empty: every user its own account)
    associations: tuple[UserAssoc, ...] = ()  # users' associations with accounts
    fairshare: FairShareAlgorithm = "fair_tree"  # fair_tree | classic
    weights: PriorityWeights = field(
        default_factory=PriorityWeights
    )  # multifactor priority weights (all 0: FIFO)
    preempt: preempt.PreemptPolicy = field(
        default_factory=preempt.PreemptPolicy
    )  # PreemptType and the default PreemptMode and GraceTime
    qos: tuple[QosPolicy, ...] = ()  # configured QOS (``normal`` is always there, configured or not)
    default_qos: str = NORMAL  # QOS of jobs without --qos in a partition without its own QOS
    account_limits: tuple[AssocLimits, ...] = ()  # association limits, by account

    blocks: dict[str, str] = field(default_factory=dict)  # topology: node -> block ([[blocks]])
    max_switch_wait_s: int = 300  # max_switch_wait: the longest --switches binds a pending job

    def __post_init__(self) -> None:
        if self.backfill_depth is not None and self.backfill_depth < 1:
            raise ValueError(f"backfill_depth must be None or at least 1, not {self.backfill_depth}")

    @cached_property
    def depth(self) -> int | None:
        """Reservations per partition and cycle (None: no bound): none with FIFO, one with EASY; with
        conservative, ``backfill_depth`` (Slurm bounds its pass by bf_max_job_test: each reservation asks
        every node state, so on thousands of nodes an unbounded pass over a deep queue takes minutes). Past
        it a blocked job waits for ``Priority`` without a planned start, and later jobs start now only where
        they delay none of the reserved ones, as under EASY (``plan.Cycle.reserve``)."""
        return {"fifo": 0, "easy": 1, "conservative": self.backfill_depth}[self.backfill]

    @cached_property
    def qos_by_name(self) -> dict[str, QosPolicy]:
        """Every QOS by name, ``normal`` included."""
        return {NORMAL: QosPolicy(NORMAL), **{q.name: q for q in self.qos}}

    @cached_property
    def limits_by_account(self) -> dict[str, AssocLimits]:
        """Association limits by account."""
        return {a.account: a for a in self.account_limits}

    @cached_property
    def limits_running(self) -> bool:
        """True if some QOS or association limits what may run at once (the cycle counts then)."""
        return any(q.limits_running for q in self.qos) or any(a.limits_running for a in self.account_limits)

    @cached_property
    def top_qos_priority(self) -> int:
        """The highest QOS priority (the QOS factor is relative to it)."""
        return max((q.priority for q in self.qos_by_name.values()), default=0)

    @cached_property
    def _parents(self) -> dict[str, str]:
        return {a.name: a.parent for a in self.accounts if a.parent is not None}

    def account_chain(self, account: str) -> list[str]:
        """The account and its ancestors up to (not including) root; just the account if not in the tree."""
        chain = [account]
        parent = self._parents.get(account)
        while parent is not None and parent != "root" and parent not in chain:
            chain.append(parent)
            parent = self._parents.get(parent)
        return chain

    @cached_property
    def default_partition(self) -> str:
        """Name of the default partition."""
        for part in self.partitions:
            if part.default:
                return part.name
        return self.partitions[0].name if self.partitions else "batch"

    @cached_property
    def by_name(self) -> dict[str, PartitionPolicy]:
        """Partitions by name."""
        return {p.name: p for p in self.partitions}

    def partition_of(self, job: Job) -> str:
        """The partition a job runs in."""
        return job.spec.partition or self.default_partition

    def time_limit(self, job: Job) -> int | None:
        """Effective time limit of a job's next run: its own, else the partition's default, capped at
        the QOS's MaxWall (a job asking for more is refused at submit)."""
        if job.spec.time_limit_s is not None:
            return job.spec.time_limit_s
        part = self.by_name.get(self.partition_of(job))
        limit = None
        if part is not None:
            limit = part.default_time_s if part.default_time_s is not None else part.max_time_s
        wall = qos_of(self, job).max_wall_s
        if wall is not None and (limit is None or limit > wall):
            return wall
        return limit
