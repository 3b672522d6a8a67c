"""The cluster file's inventory tables: ``[[nodes]]``, ``[[partitions]]``, ``[[blocks]]``, ``[[accounts]]``.

Each table kind is a frozen dataclass and a parser that validates every entry of it; ``cluster.parse_config``
puts them together (``docs/configuration.md`` documents every key). Errors are ``ConfigError`` naming the
entry and the key, e.g. ``partitions[1].nodes: gpu09 not in any [[nodes]] table``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.libs.config import values as cv
from corral.libs.config.values import ConfigError
from corral.libs.core.fair_share import Account, TreeError, UserAssoc, build_tree
from corral.libs.core.qos import AssocLimits
from corral.libs.slurm import hostlist
from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.memory import parse_memory
from corral.schemas.subjects import valid_token


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
class AccountConfig:
    """A fair-share account and its users."""

    name: str  # account name
    parent: str  # parent account ("root" for top level)
    shares: int  # raw shares among its siblings
    users: tuple[str, ...]  # users associated with it (each with 1 share)
    limits: AssocLimits | None = None  # association limits (None: none)
    coordinators: tuple[str, ...] = ()  # users who may control its and its sub-accounts' jobs (Slurm's)


def parse_nodes(raw: Any) -> list[NodeConfig]:
    """Every node of the ``[[nodes]]`` tables, each hostlist expanded, in order; a name appears once."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError("nodes: at least one [[nodes]] table is required")
    out: list[NodeConfig] = []
    for i, entry in enumerate(raw):
        where = f"nodes[{i}]"
        table = cv.table(entry, where)
        names = cv.require(table, "names", where, str)
        try:
            expanded = hostlist.expand(names)
        except FormatError as exc:
            raise ConfigError(f"{where}.names: {exc}") from None
        if not expanded:
            raise ConfigError(f'{where}.names: names no node; give a hostlist such as "gpu[01-04]"')
        cpus = cv.require(table, "cpus", where, int)
        gpus = cv.optional(table, "gpus", where, int, 0)
        if gpus < 0 or cpus < 1:
            raise ConfigError(f"{where}: cpus must be >= 1 and gpus >= 0")
        try:
            mem_mb = parse_memory(str(table.get("memory", "1G")), field=f"{where}.memory")
        except FormatError as exc:
            raise ConfigError(str(exc)) from None
        gpu_type = cv.optional(table, "gpu_type", where, str, None)
        features = cv.string_list(table, "features", where)
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


def parse_partitions(raw: Any, nodes: list[NodeConfig]) -> list[PartitionConfig]:
    """The ``[[partitions]]`` tables over ``nodes``; without any, one default partition ``batch`` of all."""
    known = {n.name for n in nodes}
    if raw is None:
        return [PartitionConfig("batch", tuple(n.name for n in nodes), True, None, None)]
    if not isinstance(raw, list) or not raw:
        raise ConfigError("partitions: expected a list of [[partitions]] tables")
    out: list[PartitionConfig] = []
    for i, entry in enumerate(raw):
        where = f"partitions[{i}]"
        table = cv.table(entry, where)
        name = cv.require(table, "name", where, str)
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
        max_time = cv.limit(table.get("max_time", "UNLIMITED"), f"{where}.max_time")
        default_time = (
            cv.limit(table["default_time"], f"{where}.default_time") if "default_time" in table else None
        )
        default = cv.optional(table, "default", where, bool, False)
        tier = cv.optional(table, "priority_tier", where, int, 1)
        mode = (
            cv.choice(table, "preempt_mode", ("requeue", "cancel", "off"), where)
            if "preempt_mode" in table
            else None
        )
        grace = cv.grace(table["grace_time"], f"{where}.grace_time") if "grace_time" in table else None
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
                qos=cv.optional(table, "qos", where, str, None),
                allow_qos=cv.string_list(table, "allow_qos", where),
                allow_accounts=cv.string_list(table, "allow_accounts", where),
                max_nodes=cv.count(table, "max_nodes", where, minimum=1),
            )
        )
    if sum(p.default for p in out) > 1:
        raise ConfigError("partitions: more than one partition has default = true; keep one")
    return out


def parse_accounts(raw: Any) -> tuple[AccountConfig, ...]:
    """The ``[[accounts]]`` tables, checked to form one fair-share tree under ``root``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("accounts: expected a list of [[accounts]] tables")
    out = []
    for i, entry in enumerate(raw):
        where = f"accounts[{i}]"
        table = cv.table(entry, where)
        name = cv.require(table, "name", where, str)
        shares = cv.optional(table, "shares", where, int, 1)
        limits = {key: cv.count(table, key, where) for key in cv.ASSOC_LIMITS}
        out.append(
            AccountConfig(
                name,
                cv.optional(table, "parent", where, str, "root"),
                shares,
                cv.string_list(table, "users", where),
                AssocLimits(name, **limits) if any(v is not None for v in limits.values()) else None,
                user_names(table, "coordinators", where),
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


def user_names(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    """A list of user names (``admins``, ``coordinators``): each a valid subject token, as a NATS user is."""
    names = cv.string_list(table, key, where)
    for name in names:
        if not valid_token(name):
            raise ConfigError(f"{where}.{key}: {name!r} is not a valid user name (letters, digits, - _)")
    return names


def parse_blocks(raw: Any, nodes: list[NodeConfig]) -> tuple[BlockConfig, ...]:
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
        table = cv.table(entry, where)
        name = cv.require(table, "name", where, str)
        if not valid_token(name):
            raise ConfigError(f"{where}.name: {name!r} is not a valid block name (letters, digits, - _)")
        if any(b.name == name for b in out):
            raise ConfigError(f"{where}.name: block {name!r} is defined twice; give each block its own name")
        try:
            members = hostlist.expand(cv.require(table, "nodes", where, str))
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
