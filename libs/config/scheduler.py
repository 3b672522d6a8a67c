"""The ``[scheduler]`` table of the cluster configuration: scheduling policy, Slurm's defaults where Slurm
has one (``docs/configuration.md`` documents every key)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from corral.libs.config import values as cv
from corral.libs.config.values import ConfigError
from corral.libs.core.lease import DEFAULT_TTL_S
from corral.libs.core.qos import NORMAL

#: ``backfill_depth``'s default, Slurm's bf_max_job_test default.
DEFAULT_DEPTH = 500


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling policy (Slurm's defaults where Slurm has one)."""

    backfill: str = "easy"  # fifo | easy | conservative
    backfill_window_s: int | None = 86400  # bf_window: how far ahead reservations are planned
    backfill_resolution_s: int = 60  # bf_resolution: run ends are planned on a grid of this many seconds
    backfill_depth: int | None = DEFAULT_DEPTH  # conservative: planned starts a partition (None: all)
    weight_age: int = 0  # PriorityWeightAge
    weight_job_size: int = 0  # PriorityWeightJobSize
    weight_partition: int = 0  # PriorityWeightPartition
    max_age_s: int = 7 * 86400  # PriorityMaxAge
    favor_small: bool = False  # PriorityFavorSmall
    snapshot_every: int = 10_000  # snapshot the scheduler's state every N log entries (0: never)
    weight_fairshare: int = 0  # PriorityWeightFairshare
    fairshare: str = "fair_tree"  # fair_tree | classic
    half_life_s: int = 7 * 86400  # PriorityDecayHalfLife
    billing_cpu: float = 0.0  # TRESBillingWeights CPU (usage is GPU-seconds by default)
    billing_gpu: float = 1.0  # TRESBillingWeights GRES/gpu
    billing_mem_gb: float = 0.0  # TRESBillingWeights Mem per GiB
    preempt_type: str = "off"  # PreemptType: off | partition_prio | qos
    preempt_mode: str = "requeue"  # PreemptMode of partitions that do not set theirs: requeue | cancel
    preempt_grace_time_s: float = 0.0  # GraceTime of partitions that do not set theirs (0: KillWait)
    weight_qos: int = 0  # PriorityWeightQOS
    default_qos: str = "normal"  # QOS of jobs without --qos in a partition without its own
    max_switch_wait_s: int = 300  # max_switch_wait: the longest a job waits for its --switches count
    lease_ttl_s: float = DEFAULT_TTL_S  # the leader lease's TTL: a standby takes over this long after a death
    min_job_age_s: int = 300  # MinJobAge: an ended job is forgotten this long after its end (0: never)


def parse_scheduler(raw: Any) -> SchedulerConfig:
    table = cv.table(raw, "scheduler")
    where = "scheduler"
    backfill = cv.optional(table, "backfill", where, str, "easy")
    if backfill not in ("fifo", "easy", "conservative"):
        raise ConfigError(f"scheduler.backfill: {backfill!r} is not one of fifo, easy, conservative")
    window = cv.limit(table.get("backfill_window", "1-00:00:00"), "scheduler.backfill_window")
    resolution = cv.optional(table, "backfill_resolution", where, int, 60)
    if not 0 <= resolution <= 3600:
        raise ConfigError(
            f"scheduler.backfill_resolution: must be 0 (exact) to 3600 seconds, got {resolution}"
        )
    weights = {
        key: cv.optional(table, key, where, int, 0)
        for key in ("priority_weight_age", "priority_weight_job_size", "priority_weight_partition")
    }
    for key, value in weights.items():
        if value < 0:
            raise ConfigError(f"scheduler.{key}: must be >= 0, got {value}")
    max_age = cv.limit(table.get("priority_max_age", "7-00:00:00"), "scheduler.priority_max_age")
    return SchedulerConfig(
        backfill=backfill,
        backfill_window_s=window,
        backfill_resolution_s=resolution,
        backfill_depth=_depth(table.get("backfill_depth", DEFAULT_DEPTH)),
        weight_age=weights["priority_weight_age"],
        weight_job_size=weights["priority_weight_job_size"],
        weight_partition=weights["priority_weight_partition"],
        max_age_s=max_age if max_age is not None else 7 * 86400,
        favor_small=cv.optional(table, "priority_favor_small", where, bool, False),
        snapshot_every=cv.optional(table, "snapshot_every", where, int, 10_000),
        weight_fairshare=_nonnegative(table, "priority_weight_fairshare"),
        fairshare=cv.choice(table, "fairshare", ("fair_tree", "classic")),
        half_life_s=cv.limit(table.get("fairshare_half_life", "7-00:00:00"), "scheduler.fairshare_half_life")
        or 0,
        billing_cpu=_weight(table, "billing_weight_cpu", 0.0),
        billing_gpu=_weight(table, "billing_weight_gpu", 1.0),
        billing_mem_gb=_weight(table, "billing_weight_mem_gb", 0.0),
        preempt_type=cv.choice(table, "preempt_type", ("off", "partition_prio", "qos")),
        preempt_mode=cv.choice(table, "preempt_mode", ("requeue", "cancel")),
        preempt_grace_time_s=cv.grace(table.get("preempt_grace_time", 0), "scheduler.preempt_grace_time"),
        weight_qos=_nonnegative(table, "priority_weight_qos"),
        default_qos=cv.optional(table, "default_qos", where, str, NORMAL),
        max_switch_wait_s=_max_switch_wait(table.get("max_switch_wait", 300)),
        lease_ttl_s=_lease_ttl(table),
        min_job_age_s=cv.whole_seconds(
            table.get("min_job_age", 300),
            "scheduler.min_job_age",
            "must be a duration, not UNLIMITED (0 keeps every job)",
        ),
    )


def _depth(value: Any) -> int | None:
    """Conservative backfill's planned starts per partition and cycle: a whole number >= 1, or UNLIMITED."""
    if isinstance(value, str) and value.upper() == "UNLIMITED":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f'scheduler.backfill_depth: expected a whole number >= 1 or "UNLIMITED", got {value!r}'
        )
    return value


def _max_switch_wait(value: Any) -> int:
    """Slurm's max_switch_wait: seconds (a number) or a Slurm duration; 0 drops --switches at once."""
    return cv.whole_seconds(
        value, "scheduler.max_switch_wait", "must be a duration, not UNLIMITED (Slurm's default is 300 s)"
    )


def _lease_ttl(table: dict[str, Any]) -> float:
    """The leader lease's TTL in seconds: from 0.5 (failover in about a second) to 300."""
    value = _weight(table, "lease_ttl", DEFAULT_TTL_S)
    if not 0.5 <= value <= 300:
        raise ConfigError(f"scheduler.lease_ttl: must be 0.5 to 300 seconds, got {value!r}")
    return value


def _nonnegative(table: dict[str, Any], key: str) -> int:
    value: int = cv.optional(table, key, "scheduler", int, 0)
    if value < 0:
        raise ConfigError(f"scheduler.{key}: must be >= 0, got {value}")
    return value


def _weight(table: dict[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"scheduler.{key}: expected a number >= 0, got {value!r}")
    return float(value)
