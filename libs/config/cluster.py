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

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.libs.config import values as cv
from corral.libs.config.scheduler import SchedulerConfig as SchedulerConfig
from corral.libs.config.scheduler import parse_scheduler
from corral.libs.config.values import ConfigError as ConfigError
from corral.libs.core.fair_share import Account, TreeError, UserAssoc, build_tree
from corral.libs.core.qos import NORMAL, AssocLimits, QosPolicy
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


@dataclass(frozen=True)
class ClusterConfig:
    """The whole cluster configuration."""

    name: str  # cluster name (SLURM_CLUSTER_NAME)
    nodes: tuple[NodeConfig, ...]  # every node, in config order
    partitions: tuple[PartitionConfig, ...]  # every partition, in config order
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # scheduling policy
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


def _cgroup_root(cluster: dict[str, Any]) -> str:
    """``cluster.cgroup_root``: a relative path of names (letters, digits, - _), e.g. ``corral`` or
    ``site/corral``; run cgroups are created in it, under the memory controller's hierarchy."""
    value = cv.optional(cluster, "cgroup_root", "cluster", str, "corral")
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


def _partitions(raw: Any, nodes: list[NodeConfig]) -> list[PartitionConfig]:
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


def _accounts(raw: Any) -> tuple[AccountConfig, ...]:
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


def parse_config(
    text: str, source: str = "<string>", scheduler: Mapping[str, Any] | None = None
) -> ClusterConfig:
    """Parse and validate a cluster configuration; ``scheduler`` keys replace the file's ``[scheduler]``
    ones before validation (``corral sim --set``)."""
    # QOS parsing lives in its own module, which builds on this one's helpers.
    from corral.libs.config.qos import check_qos_references, parse_qos

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    cv.table(doc, "")
    if scheduler:
        doc["scheduler"] = {**cv.table(doc.get("scheduler", {}), "scheduler"), **scheduler}
    cluster = cv.table(doc.get("cluster", {}), "cluster")
    name = cluster.get("name", "corral")
    if not isinstance(name, str) or not valid_token(name):
        raise ConfigError(f"cluster.name: {name!r} is not a valid name (letters, digits, - _)")
    nodes = _nodes(doc.get("nodes"))
    config = ClusterConfig(
        name=name,
        nodes=tuple(nodes),
        partitions=tuple(_partitions(doc.get("partitions"), nodes)),
        scheduler=parse_scheduler(doc.get("scheduler", {})),
        accounts=_accounts(doc.get("accounts")),
        blocks=_blocks(doc.get("blocks"), nodes),
        heartbeat_interval_s=cv.seconds(cluster.get("heartbeat_interval", 2), "cluster.heartbeat_interval"),
        node_timeout_s=cv.seconds(cluster.get("node_timeout", 10), "cluster.node_timeout"),
        kill_wait_s=cv.seconds(cluster.get("kill_wait", 5), "cluster.kill_wait"),
        constrain_ram_space=cv.optional(cluster, "constrain_ram_space", "cluster", bool, False),
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
