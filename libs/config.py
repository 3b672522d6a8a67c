"""Cluster configuration from one TOML file: nodes, partitions and service timing.

Example (``docs/configuration.md`` documents every key)::

    [cluster]
    name = "local"
    heartbeat_interval = 2          # seconds (or a Slurm time string: "0:02" = 2 s; "2" = 2 minutes)
    node_timeout = "0:10"           # SlurmdTimeout: heartbeats missing this long -> NodeDown
    kill_wait = "0:05"              # KillWait: SIGTERM -> SIGKILL
    constrain_ram_space = true      # cgroup.conf's ConstrainRAMSpace: each run in a memory cgroup
    cgroup_root = "corral"          # where run cgroups go, under the memory controller's hierarchy

    [[nodes]]
    names = "gpu[01-04]"            # a Slurm hostlist
    cpus = 32
    memory = "256G"
    gpus = 8
    gpu_type = "h100"
    features = ["nvlink"]

    [[partitions]]
    name = "gpu"
    nodes = "gpu[01-04]"
    default = true
    max_time = "1-00:00:00"
    default_time = "1:00:00"

    [[blocks]]                      # topology: an NVLink domain or a leaf switch
    name = "nvl1"
    nodes = "gpu[01-02]"

Errors are ``ConfigError`` naming the key and the fix; nothing is half-loaded.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.libs.core.fair_share import Account, TreeError, UserAssoc, build_tree
from corral.libs.core.qos import NORMAL, AssocLimits, QosPolicy
from corral.libs.slurm import hostlist
from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.memory import parse_memory
from corral.libs.slurm.timefmt import parse_time_limit
from corral.schemas.subjects import valid_token


class ConfigError(ValueError):
    """The cluster configuration is invalid; the message names the key and the fix."""


@dataclass(frozen=True)
class NodeConfig:
    """One node's configured inventory."""

    name: str  # node name (a subject token; must resolve on the cluster's machines)
    cpus: int  # CPUs
    mem_mb: int  # memory in MiB
    gpus: int  # GPUs
    gpu_type: str | None  # GPU model
    features: tuple[str, ...]  # features for --constraint


@dataclass(frozen=True)
class PartitionConfig:
    """One partition."""

    name: str  # name
    nodes: tuple[str, ...]  # node names
    default: bool  # the default partition
    max_time_s: int | None  # MaxTime (None = UNLIMITED)
    default_time_s: int | None  # DefaultTime (None = MaxTime)
    priority_tier: int = 1  # PriorityTier: higher tiers are scheduled first
    preempt_mode: str | None = None  # PreemptMode of its jobs: requeue | cancel | off (None: the default)
    grace_time_s: float | None = None  # GraceTime of its preempted jobs (None: the default)
    qos: str | None = None  # QOS of jobs without --qos (None: the default QOS)
    allow_qos: tuple[str, ...] = ()  # AllowQos: QOS jobs may use here (empty: all)
    allow_accounts: tuple[str, ...] = ()  # AllowAccounts: accounts jobs may charge here (empty: all)
    max_nodes: int | None = None  # MaxNodes: most nodes of one job (None: UNLIMITED)


@dataclass(frozen=True)
class BlockConfig:
    """A topology block: nodes that share an NVLink domain or a leaf switch."""

    name: str  # block name
    nodes: tuple[str, ...]  # member node names


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduling policy (Slurm's defaults where Slurm has one)."""

    backfill: str = "easy"  # fifo | easy | conservative
    backfill_window_s: int | None = 86400  # bf_window: how far ahead reservations are planned
    backfill_resolution_s: int = 60  # bf_resolution: run ends are planned on a grid of this many seconds
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


@dataclass(frozen=True)
class AccountConfig:
    """A fair-share account and its users."""

    name: str  # account name
    parent: str  # parent account ("root" for top level)
    shares: int  # raw shares among its siblings
    users: tuple[str, ...]  # users associated with it (each with 1 share)
    limits: AssocLimits | None = None  # association limits (None: none)


@dataclass(frozen=True)
class ClusterConfig:
    """The whole cluster configuration."""

    name: str  # cluster name (SLURM_CLUSTER_NAME)
    nodes: tuple[NodeConfig, ...]  # every node, in config order
    partitions: tuple[PartitionConfig, ...]  # every partition, in config order
    scheduler: SchedulerConfig = SchedulerConfig()  # scheduling policy
    accounts: tuple[AccountConfig, ...] = ()  # fair-share accounts (empty: every user is their own)
    blocks: tuple[BlockConfig, ...] = ()  # topology blocks (a node in none is a block of its own)

    def default_account(self, user: str) -> str:
        """The account a job is charged to without -A: the first account listing the user, else the user."""
        for account in self.accounts:
            if user in account.users:
                return account.name
        return user

    def may_use(self, user: str, account: str) -> bool:
        """Whether ``user`` may charge ``account`` (anyone may use any account when none is configured)."""
        if not self.accounts or account == self.default_account(user):
            return True
        return any(a.name == account and user in a.users for a in self.accounts)

    heartbeat_interval_s: float = 2.0  # agent heartbeat period
    node_timeout_s: float = 10.0  # SlurmdTimeout
    kill_wait_s: float = 5.0  # KillWait
    constrain_ram_space: bool = False  # cgroup.conf ConstrainRAMSpace: confine each run to its memory
    cgroup_root: str = "corral"  # run cgroups' directory, relative to the memory controller's hierarchy
    source: str = field(default="", compare=False)  # where it was read from
    qos: tuple[QosPolicy, ...] = (QosPolicy(NORMAL),)  # every QOS, ``normal`` always among them

    def qos_named(self, name: str) -> QosPolicy | None:
        """The QOS called ``name``, or None."""
        return next((q for q in self.qos if q.name == name), None)

    def account(self, name: str) -> AccountConfig | None:
        """The account called ``name``, or None."""
        return next((a for a in self.accounts if a.name == name), None)

    def node(self, name: str) -> NodeConfig:
        """The node called ``name``; KeyError if not configured."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def block_map(self) -> dict[str, str]:
        """Node name -> its block's name, for the nodes in a ``[[blocks]]`` table."""
        return {node: block.name for block in self.blocks for node in block.nodes}

    def partitions_of(self, node: str) -> list[str]:
        """Names of the partitions a node belongs to."""
        return [p.name for p in self.partitions if node in p.nodes]

    @property
    def default_partition(self) -> PartitionConfig:
        """The default partition (the first one if none is marked default)."""
        for part in self.partitions:
            if part.default:
                return part
        return self.partitions[0]

    def partition(self, name: str) -> PartitionConfig | None:
        """The partition called ``name``, or None."""
        for part in self.partitions:
            if part.name == name:
                return part
        return None


#: Association limit keys of an ``[[accounts]]`` table.
_ASSOC_LIMITS = ("grp_gres", "grp_jobs", "max_jobs_per_user", "max_gres_per_user", "max_submit_jobs_per_user")

_KEYS = {
    "": {"cluster", "scheduler", "nodes", "partitions", "accounts", "qos", "blocks"},
    "accounts": {"name", "parent", "shares", "users", *_ASSOC_LIMITS},
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
        "priority_weight_age",
        "priority_weight_job_size",
        "priority_weight_partition",
        "priority_max_age",
        "priority_favor_small",
        "snapshot_every",
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


def _table(value: Any, where: str) -> dict[str, Any]:
    """A TOML table, with no key the configuration does not know (a typo must not pass silently)."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table, got {value!r}")
    known = _KEYS[where.split("[", 1)[0]]
    for key in value:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
    return value


def _optional(table: dict[str, Any], key: str, where: str, kind: type, default: Any) -> Any:
    if key not in table:
        return default
    return _require(table, key, where, kind)


def _string_list(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}.{key}: expected a list of strings, got {value!r}")
    return tuple(value)


def _require(table: dict[str, Any], key: str, where: str, kind: type) -> Any:
    if key not in table:
        raise ConfigError(f"{where}: missing key {key!r}")
    value = table[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ConfigError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _seconds(value: Any, where: str) -> float:
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


def _limit(value: Any, where: str) -> int | None:
    """A duration: a TOML number is seconds; a string is Slurm's format (a lone number there is minutes)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: must be 0 or more seconds, got {value!r}")
        return math.ceil(value)
    try:
        return parse_time_limit(str(value), field=where)
    except FormatError as exc:
        raise ConfigError(str(exc)) from None


def _cgroup_root(cluster: dict[str, Any]) -> str:
    """``cluster.cgroup_root``: a relative path of names (letters, digits, - _), e.g. ``corral`` or
    ``site/corral``; run cgroups are created in it, under the memory controller's hierarchy."""
    value = _optional(cluster, "cgroup_root", "cluster", str, "corral")
    parts = value.split("/")
    if not all(valid_token(p) for p in parts):
        raise ConfigError(
            f"cluster.cgroup_root: {value!r} is not a relative path of names (letters, digits, - _) "
            'separated by /, e.g. "corral"'
        )
    return str(value)


def _nodes(raw: Any) -> list[NodeConfig]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("nodes: at least one [[nodes]] table is required")
    out: list[NodeConfig] = []
    for i, entry in enumerate(raw):
        where = f"nodes[{i}]"
        table = _table(entry, where)
        names = _require(table, "names", where, str)
        try:
            expanded = hostlist.expand(names)
        except FormatError as exc:
            raise ConfigError(f"{where}.names: {exc}") from None
        if not expanded:
            raise ConfigError(f'{where}.names: names no node; give a hostlist such as "gpu[01-04]"')
        cpus = _require(table, "cpus", where, int)
        gpus = _optional(table, "gpus", where, int, 0)
        if gpus < 0 or cpus < 1:
            raise ConfigError(f"{where}: cpus must be >= 1 and gpus >= 0")
        try:
            mem_mb = parse_memory(str(table.get("memory", "1G")), field=f"{where}.memory")
        except FormatError as exc:
            raise ConfigError(str(exc)) from None
        gpu_type = _optional(table, "gpu_type", where, str, None)
        features = _string_list(table, "features", where)
        for name in expanded:
            if not valid_token(name):
                raise ConfigError(f"{where}.names: {name!r} is not a valid node name (letters, digits, - _)")
            out.append(NodeConfig(name, cpus, mem_mb, gpus, gpu_type, features))
    seen: set[str] = set()
    for node in out:
        if node.name in seen:
            raise ConfigError(f"nodes: {node.name!r} is configured twice")
        seen.add(node.name)
    return out


def _partitions(raw: Any, nodes: list[NodeConfig]) -> list[PartitionConfig]:
    known = {n.name for n in nodes}
    if raw is None:
        return [PartitionConfig("batch", tuple(n.name for n in nodes), True, None, None)]
    if not isinstance(raw, list) or not raw:
        raise ConfigError("partitions: expected a list of [[partitions]] tables")
    out: list[PartitionConfig] = []
    for i, entry in enumerate(raw):
        where = f"partitions[{i}]"
        table = _table(entry, where)
        name = _require(table, "name", where, str)
        if any(p.name == name for p in out):
            raise ConfigError(f"{where}.name: partition {name!r} is defined twice")
        if not valid_token(name):
            raise ConfigError(f"{where}.name: {name!r} is not a valid partition name")
        spec = table.get("nodes", "ALL")
        try:
            members = sorted(known) if spec == "ALL" else hostlist.expand(str(spec))
        except FormatError as exc:
            raise ConfigError(f"{where}.nodes: {exc}") from None
        unknown = [m for m in members if m not in known]
        if unknown:
            raise ConfigError(f"{where}.nodes: {', '.join(unknown)} not in any [[nodes]] table")
        max_time = _limit(table.get("max_time", "UNLIMITED"), f"{where}.max_time")
        default_time = (
            _limit(table["default_time"], f"{where}.default_time") if "default_time" in table else None
        )
        default = _optional(table, "default", where, bool, False)
        tier = _optional(table, "priority_tier", where, int, 1)
        mode = (
            _choice(table, "preempt_mode", ("requeue", "cancel", "off"), where)
            if "preempt_mode" in table
            else None
        )
        grace = _grace(table["grace_time"], f"{where}.grace_time") if "grace_time" in table else None
        out.append(
            PartitionConfig(
                name,
                tuple(members),
                default,
                max_time,
                default_time,
                tier,
                mode,
                grace,
                qos=_optional(table, "qos", where, str, None),
                allow_qos=_string_list(table, "allow_qos", where),
                allow_accounts=_string_list(table, "allow_accounts", where),
                max_nodes=_count(table, "max_nodes", where, minimum=1),
            )
        )
    if sum(p.default for p in out) > 1:
        raise ConfigError("partitions: more than one partition has default = true; keep one")
    return out


def _scheduler(raw: Any) -> SchedulerConfig:
    table = _table(raw, "scheduler")
    where = "scheduler"
    backfill = _optional(table, "backfill", where, str, "easy")
    if backfill not in ("fifo", "easy", "conservative"):
        raise ConfigError(f"scheduler.backfill: {backfill!r} is not one of fifo, easy, conservative")
    window = _limit(table.get("backfill_window", "1-00:00:00"), "scheduler.backfill_window")
    resolution = _optional(table, "backfill_resolution", where, int, 60)
    if not 0 <= resolution <= 3600:
        raise ConfigError(
            f"scheduler.backfill_resolution: must be 0 (exact) to 3600 seconds, got {resolution}"
        )
    weights = {
        key: _optional(table, key, where, int, 0)
        for key in ("priority_weight_age", "priority_weight_job_size", "priority_weight_partition")
    }
    for key, value in weights.items():
        if value < 0:
            raise ConfigError(f"scheduler.{key}: must be >= 0, got {value}")
    max_age = _limit(table.get("priority_max_age", "7-00:00:00"), "scheduler.priority_max_age")
    return SchedulerConfig(
        backfill=backfill,
        backfill_window_s=window,
        backfill_resolution_s=resolution,
        weight_age=weights["priority_weight_age"],
        weight_job_size=weights["priority_weight_job_size"],
        weight_partition=weights["priority_weight_partition"],
        max_age_s=max_age if max_age is not None else 7 * 86400,
        favor_small=_optional(table, "priority_favor_small", where, bool, False),
        snapshot_every=_optional(table, "snapshot_every", where, int, 10_000),
        weight_fairshare=_nonnegative(table, "priority_weight_fairshare"),
        fairshare=_choice(table, "fairshare", ("fair_tree", "classic")),
        half_life_s=_limit(table.get("fairshare_half_life", "7-00:00:00"), "scheduler.fairshare_half_life")
        or 0,
        billing_cpu=_weight(table, "billing_weight_cpu", 0.0),
        billing_gpu=_weight(table, "billing_weight_gpu", 1.0),
        billing_mem_gb=_weight(table, "billing_weight_mem_gb", 0.0),
        preempt_type=_choice(table, "preempt_type", ("off", "partition_prio", "qos")),
        preempt_mode=_choice(table, "preempt_mode", ("requeue", "cancel")),
        preempt_grace_time_s=_grace(table.get("preempt_grace_time", 0), "scheduler.preempt_grace_time"),
        weight_qos=_nonnegative(table, "priority_weight_qos"),
        default_qos=_optional(table, "default_qos", where, str, NORMAL),
        max_switch_wait_s=_max_switch_wait(table.get("max_switch_wait", 300)),
    )


def _max_switch_wait(value: Any) -> int:
    """Slurm's max_switch_wait: seconds (a number) or a Slurm duration; 0 drops --switches at once."""
    where = "scheduler.max_switch_wait"
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{where}: must be >= 0 seconds, got {value}")
        return value
    parsed = _limit(value, where)
    if parsed is None:
        raise ConfigError(f"{where}: must be a duration, not UNLIMITED (Slurm's default is 300 s)")
    return parsed


def _nonnegative(table: dict[str, Any], key: str) -> int:
    value: int = _optional(table, key, "scheduler", int, 0)
    if value < 0:
        raise ConfigError(f"scheduler.{key}: must be >= 0, got {value}")
    return value


def _choice(table: dict[str, Any], key: str, choices: tuple[str, ...], where: str = "scheduler") -> str:
    value: str = _optional(table, key, where, str, choices[0])
    if value not in choices:
        raise ConfigError(f"{where}.{key}: {value!r} is not one of {', '.join(choices)}")
    return value


def _grace(value: Any, where: str) -> float:
    """A GraceTime: seconds (a number) or a Slurm duration; 0 (no grace beyond KillWait) allowed."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected seconds or a duration, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"{where}: must be 0 or more seconds, got {value!r}")
        return float(value)
    parsed = _limit(value, where)
    if parsed is None:
        raise ConfigError(
            f'{where}: must be a duration (seconds, or a Slurm time such as "0:30"), got {value!r}'
        )
    return float(parsed)


def _weight(table: dict[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"scheduler.{key}: expected a number >= 0, got {value!r}")
    return float(value)


def _accounts(raw: Any) -> tuple[AccountConfig, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("accounts: expected a list of [[accounts]] tables")
    out = []
    for i, entry in enumerate(raw):
        where = f"accounts[{i}]"
        table = _table(entry, where)
        name = _require(table, "name", where, str)
        shares = _optional(table, "shares", where, int, 1)
        limits = {key: _count(table, key, where) for key in _ASSOC_LIMITS}
        out.append(
            AccountConfig(
                name,
                _optional(table, "parent", where, str, "root"),
                shares,
                _string_list(table, "users", where),
                AssocLimits(name, **limits) if any(v is not None for v in limits.values()) else None,
            )
        )
    try:
        build_tree(
            [Account(a.name, a.parent, a.shares) for a in out],
            [UserAssoc(u, a.name) for a in out for u in a.users],
        )
    except TreeError as exc:
        raise ConfigError(f"accounts: {exc}") from None
    return tuple(out)


def _count(table: dict[str, Any], key: str, where: str, minimum: int = 0) -> int | None:
    """An optional whole-number limit (None when absent: unlimited)."""
    value: int | None = _optional(table, key, where, int, None)
    if value is not None and value < minimum:
        raise ConfigError(f"{where}.{key}: must be >= {minimum}, got {value}")
    return value


def _blocks(raw: Any, nodes: list[NodeConfig]) -> tuple[BlockConfig, ...]:
    """Topology blocks: each names nodes that exist, and no node is in two blocks."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("blocks: expected a list of [[blocks]] tables")
    known = {n.name for n in nodes}
    owner: dict[str, str] = {}
    out: list[BlockConfig] = []
    for i, entry in enumerate(raw):
        where = f"blocks[{i}]"
        table = _table(entry, where)
        name = _require(table, "name", where, str)
        if not valid_token(name):
            raise ConfigError(f"{where}.name: {name!r} is not a valid block name (letters, digits, - _)")
        if any(b.name == name for b in out):
            raise ConfigError(f"{where}.name: block {name!r} is defined twice; give each block its own name")
        try:
            members = hostlist.expand(_require(table, "nodes", where, str))
        except FormatError as exc:
            raise ConfigError(f"{where}.nodes: {exc}") from None
        if not members:
            raise ConfigError(f'{where}.nodes: names no node; give a hostlist such as "gpu[01-04]"')
        for node in members:
            if node not in known:
                raise ConfigError(f"{where}.nodes: {node} is not in any [[nodes]] table")
            if node in owner:
                raise ConfigError(
                    f"{where}.nodes: {node} is already in block {owner[node]!r}; a node belongs to one block"
                )
            owner[node] = name
        out.append(BlockConfig(name, tuple(members)))
    return tuple(out)


def parse_config(
    text: str, source: str = "<string>", scheduler: Mapping[str, Any] | None = None
) -> ClusterConfig:
    """Parse and validate a cluster configuration; ``scheduler`` keys replace the file's ``[scheduler]``
    ones before validation (``corral sim --set``)."""
    # QOS parsing lives in its own module, which builds on this one's helpers.
    from corral.libs.qos_config import check_qos_references, parse_qos

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    _table(doc, "")
    if scheduler:
        doc["scheduler"] = {**_table(doc.get("scheduler", {}), "scheduler"), **scheduler}
    cluster = _table(doc.get("cluster", {}), "cluster")
    name = cluster.get("name", "corral")
    if not isinstance(name, str) or not valid_token(name):
        raise ConfigError(f"cluster.name: {name!r} is not a valid name (letters, digits, - _)")
    nodes = _nodes(doc.get("nodes"))
    config = ClusterConfig(
        name=name,
        nodes=tuple(nodes),
        partitions=tuple(_partitions(doc.get("partitions"), nodes)),
        scheduler=_scheduler(doc.get("scheduler", {})),
        accounts=_accounts(doc.get("accounts")),
        blocks=_blocks(doc.get("blocks"), nodes),
        heartbeat_interval_s=_seconds(cluster.get("heartbeat_interval", 2), "cluster.heartbeat_interval"),
        node_timeout_s=_seconds(cluster.get("node_timeout", 10), "cluster.node_timeout"),
        kill_wait_s=_seconds(cluster.get("kill_wait", 5), "cluster.kill_wait"),
        constrain_ram_space=_optional(cluster, "constrain_ram_space", "cluster", bool, False),
        cgroup_root=_cgroup_root(cluster),
        source=source,
        qos=parse_qos(doc.get("qos")),
    )
    check_qos_references(config)
    if config.heartbeat_interval_s >= config.node_timeout_s:
        raise ConfigError(
            f"cluster.heartbeat_interval ({config.heartbeat_interval_s:g}s) must be shorter than "
            f"cluster.node_timeout ({config.node_timeout_s:g}s), or every node would be marked down"
        )
    return config


def load_config(path: Path, scheduler: Mapping[str, Any] | None = None) -> ClusterConfig:
    """Read and validate the cluster configuration file (``scheduler``: as for ``parse_config``)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read cluster config {path}: {exc.strerror}") from None
    return parse_config(text, source=str(path), scheduler=scheduler)


def local_config_text(name: str, nodes: list[str], gpus_per_node: int, cpus: int, mem_mb: int) -> str:
    """The configuration ``corral up`` writes for a local cluster of simulated GPU nodes."""
    names = hostlist.compress(nodes)
    return (
        f'[cluster]\nname = "{name}"\nheartbeat_interval = 1\nnode_timeout = 6\nkill_wait = 3\n'
        "constrain_ram_space = true\n\n"
        f'[[nodes]]\nnames = "{names}"\ncpus = {cpus}\nmemory = "{mem_mb}M"\n'
        f'gpus = {gpus_per_node}\ngpu_type = "sim"\n\n'
        f'[[partitions]]\nname = "gpu"\nnodes = "{names}"\ndefault = true\n'
        f'max_time = "UNLIMITED"\n'
    )
