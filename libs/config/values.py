"""The keys a cluster configuration may have, and typed readers of TOML values that name the key at fault.

Every reader raises ``ConfigError`` with the key's place (``partitions[1].max_time``) and what is expected;
``table`` refuses keys the configuration does not know, so a typo never passes silently. Shared by
``config.py`` and ``qos_config.py``.
"""

from __future__ import annotations

import math
from typing import Any

from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.timefmt import parse_time_limit


class ConfigError(ValueError):
    """The cluster configuration is invalid; the message names the key and the fix."""


#: Association limit keys of an ``[[accounts]]`` table.
ASSOC_LIMITS = ("grp_gres", "grp_jobs", "max_jobs_per_user", "max_gres_per_user", "max_submit_jobs_per_user")


KEYS = {
    "": {
        "cluster",
        "scheduler",
        "accounting",
        "nodes",
        "partitions",
        "accounts",
        "qos",
        "blocks",
        "service_accounts",
    },
    "service_accounts": {
        "name",
        "submit_for_accounts",
        "submit_for_users",
        "report_health_nodes",
        "read_feed",
    },
    "accounting": {"partitions", "lease_ttl"},
    "accounts": {"name", "parent", "shares", "users", "coordinators", *ASSOC_LIMITS},
    "qos": {
        "name",
        "priority",
        "max_gres_per_user",
        "max_jobs_per_user",
        "max_submit_jobs_per_user",
        "grp_gres",
        "max_wall",
        "preempt",
        "preempt_mode",
        "grace_time",
    },
    "blocks": {"name", "nodes"},
    "scheduler": {
        "backfill",
        "backfill_window",
        "backfill_resolution",
        "backfill_depth",
        "priority_weight_age",
        "priority_weight_job_size",
        "priority_weight_partition",
        "priority_max_age",
        "priority_favor_small",
        "snapshot_every",
        "lease_ttl",
        "min_job_age",
        "priority_weight_fairshare",
        "fairshare",
        "fairshare_half_life",
        "billing_weight_cpu",
        "billing_weight_gpu",
        "billing_weight_mem_gb",
        "preempt_type",
        "preempt_mode",
        "preempt_grace_time",
        "priority_weight_qos",
        "default_qos",
        "max_switch_wait",
    },
    "cluster": {
        "name",
        "heartbeat_interval",
        "node_timeout",
        "kill_wait",
        "constrain_ram_space",
        "cgroup_root",
        "admins",
        "allow_root_jobs",
        "health_check_program",
        "health_check_interval",
        "health_failure_action",
        "enforce_part_limits",
        "tmpdir_base",
    },
    "nodes": {"names", "cpus", "memory", "gpus", "gpu_type", "features"},
    "partitions": {
        "name",
        "nodes",
        "default",
        "max_time",
        "default_time",
        "priority_tier",
        "preempt_mode",
        "grace_time",
        "qos",
        "allow_qos",
        "allow_accounts",
        "max_nodes",
    },
}


def table(value: Any, where: str) -> dict[str, Any]:
    """A TOML table, with no key the configuration does not know (a typo must not pass silently)."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table, got {value!r}")
    known = KEYS[where.split("[", 1)[0]]
    for key in value:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
    return value


def optional(table: dict[str, Any], key: str, where: str, kind: type, default: Any) -> Any:
    if key not in table:
        return default
    return require(table, key, where, kind)


def string_list(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def require(table: dict[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in table:
        raise ConfigError(f"{where}: missing key {key!r}")
    value = table[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ConfigError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def seconds(value: Any, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{where}: must be positive, got {value!r}")
        return float(value)
    try:
        parsed = parse_time_limit(str(value), field=where)
    except FormatError as exc:
        raise ConfigError(str(exc)) from None
    if parsed is None or parsed <= 0:
        raise ConfigError(f"{where}: must be a positive duration, got {value!r}")
    return float(parsed)


def limit(value: Any, where: str) -> int | None:
    """A duration: a TOML number is seconds; a string is Slurm's format (a lone number there is minutes)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: must be 0 or more seconds, got {value!r}")
        return math.ceil(value)
    try:
        return parse_time_limit(str(value), field=where)
    except FormatError as exc:
        raise ConfigError(str(exc)) from None


def choice(table: dict[str, Any], key: str, choices: tuple[str, ...], where: str = "scheduler") -> str:
    value: str = optional(table, key, where, str, choices[0])
    if value not in choices:
        raise ConfigError(f"{where}.{key}: {value!r} is not one of {', '.join(choices)}")
    return value


def grace(value: Any, where: str) -> float:
    """A GraceTime: seconds (a number) or a Slurm duration; 0 (no grace beyond KillWait) allowed."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected seconds or a duration, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: must be 0 or more seconds, got {value!r}")
        return float(value)
    parsed = limit(value, where)
    if parsed is None:
        raise ConfigError(
            f'{where}: must be a duration (seconds, or a Slurm time such as "0:30"), got {value!r}'
        )
    return float(parsed)


def count(table: dict[str, Any], key: str, where: str, minimum: int = 0) -> int | None:
    """An optional whole-number limit (None when absent: unlimited)."""
    value: int | None = optional(table, key, where, int, None)
    if value is not None and value < minimum:
        raise ConfigError(f"{where}.{key}: must be >= {minimum}, got {value}")
    return value


def whole_seconds(value: Any, where: str, not_unlimited: str) -> int:
    """A duration in whole seconds: a TOML integer (seconds, >= 0) or a Slurm duration string, never
    UNLIMITED (``not_unlimited`` says so in the key's own words)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{where}: must be >= 0 seconds, got {value}")
        return value
    parsed = limit(value, where)
    if parsed is None:
        raise ConfigError(f"{where}: {not_unlimited}")
    return parsed
