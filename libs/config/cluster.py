"""Cluster configuration from one TOML file: the whole ``ClusterConfig``, its ``[cluster]`` table, loading.

Example (``docs/configuration.md`` documents every key)::

    [cluster]
    name = "local"
    heartbeat_interval = 2          # seconds (or a Slurm time string: "0:02" = 2 s; "2" = 2 minutes)
    node_timeout = "0:10"           # SlurmdTimeout: heartbeats missing this long -> NodeDown
    kill_wait = "0:05"              # KillWait: SIGTERM -> SIGKILL
    constrain_ram_space = true      # cgroup.conf's ConstrainRAMSpace: each run in a memory cgroup
    cgroup_root = "corral"          # where run cgroups go, under the memory controller's hierarchy
    allow_root_jobs = false         # Slurm's DisableRootJobs inverted: root's jobs are refused at submit
    tmpdir_base = "/tmp"            # each run's private TMPDIR is made under it, on each node

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

The inventory tables (nodes, partitions, blocks, accounts) are parsed in ``tables.py``, the ``[scheduler]``
table in ``scheduler.py``, the ``[accounting]`` table in ``accounting.py`` and the ``[[qos]]`` tables in
``qos.py``; their dataclasses are re-exported here.
Errors are ``ConfigError`` naming the key and the fix; nothing is half-loaded.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from corral.libs.config import values as cv
from corral.libs.config.accounting import AccountingConfig as AccountingConfig
from corral.libs.config.accounting import parse_accounting
from corral.libs.config.qos import check_qos_references, parse_qos
from corral.libs.config.scheduler import SchedulerConfig as SchedulerConfig
from corral.libs.config.scheduler import parse_scheduler
from corral.libs.config.service_accounts import parse_service_accounts
from corral.libs.config.tables import AccountConfig as AccountConfig
from corral.libs.config.tables import BlockConfig as BlockConfig
from corral.libs.config.tables import NodeConfig as NodeConfig
from corral.libs.config.tables import PartitionConfig as PartitionConfig
from corral.libs.config.tables import parse_accounts, parse_blocks, parse_nodes, parse_partitions, user_names
from corral.libs.config.values import ConfigError as ConfigError
from corral.libs.core.node_health import FAILURE_ACTIONS, FailureAction
from corral.libs.core.qos import NORMAL, QosPolicy
from corral.libs.core.scopes import ServiceAccount
from corral.libs.slurm import hostlist
from corral.schemas.subjects import valid_token

#: ``[cluster] enforce_part_limits`` (Slurm's EnforcePartLimits), the default first.
ENFORCE_PART_LIMITS = ("ALL", "ANY", "NO")


@dataclass(frozen=True)
class ClusterConfig:
    """The whole cluster configuration."""

    name: str  # cluster name (SLURM_CLUSTER_NAME)
    nodes: tuple[NodeConfig, ...]  # every node, in config order
    partitions: tuple[PartitionConfig, ...]  # every partition, in config order
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # scheduling policy
    accounting: AccountingConfig = field(default_factory=AccountingConfig)  # how the projection is shared
    accounts: tuple[AccountConfig, ...] = ()  # fair-share accounts (empty: every user is their own)
    blocks: tuple[BlockConfig, ...] = ()  # topology blocks (a node in none is a block of its own)
    admins: tuple[str, ...] = ()  # [cluster] admins: users who may act on every job (Slurm's AdminLevel)

    def default_account(self, user: str) -> str:
        """The account a job is charged to without -A: the first account listing the user, else the user."""
        listing = self._accounts_by_user.get(user)
        return listing[0] if listing else user

    def accounts_of(self, user: str) -> list[str]:
        """The accounts ``user`` may charge: those listing the user, else the user's own (as without any
        ``[[accounts]]``, where every user is their own account)."""
        return list(self._accounts_by_user.get(user, ())) or [user]

    @cached_property
    def _accounts_by_user(self) -> dict[str, list[str]]:
        """The accounts listing each user, in config order (asked at every submission: a site has thousands
        of accounts)."""
        out: dict[str, list[str]] = {}
        for account in self.accounts:
            for user in dict.fromkeys(account.users):
                out.setdefault(user, []).append(account.name)
        return out

    @cached_property
    def _account_named(self) -> dict[str, AccountConfig]:
        """Each account by name (the first of a name, as the pass this replaces found)."""
        out: dict[str, AccountConfig] = {}
        for account in self.accounts:
            out.setdefault(account.name, account)
        return out

    def may_use(self, user: str, account: str) -> bool:
        """Whether ``user`` may charge ``account`` (one of ``accounts_of``: any other is refused at submit, as
        Slurm refuses an account the user has no association with)."""
        return account in self.accounts_of(user)

    heartbeat_interval_s: float = 2.0  # agent heartbeat period
    node_timeout_s: float = 10.0  # SlurmdTimeout
    kill_wait_s: float = 5.0  # KillWait
    constrain_ram_space: bool = False  # cgroup.conf ConstrainRAMSpace: confine each run to its memory
    cgroup_root: str = "corral"  # run cgroups' directory, relative to the memory controller's hierarchy
    source: str = field(default="", compare=False)  # where it was read from
    qos: tuple[QosPolicy, ...] = (QosPolicy(NORMAL),)  # every QOS, ``normal`` always among them
    allow_root_jobs: bool = False  # root may submit jobs (that run as root); Slurm's DisableRootJobs=NO
    service_accounts: tuple[ServiceAccount, ...] = ()  # [[service_accounts]]: systems and their scopes
    health_check_program: str = ""  # HealthCheckProgram: run by each agent, as root ("": none)
    health_check_interval_s: float = 60.0  # HealthCheckInterval: seconds between two runs of it
    health_failure_action: FailureAction = "requeue"  # a failing health report: requeue its jobs, or drain
    # EnforcePartLimits: ALL/ANY refuse at submit a job over its partition's MaxNodes, MaxTime or node count
    # (Corral's default: one partition per job, so ANY is ALL); NO accepts it, and it pends with Slurm's
    # PartitionNodeLimit, PartitionTimeLimit or PartitionConfig (Slurm's default).
    enforce_part_limits: str = "ALL"
    # Where each agent makes every run's private TMPDIR (job_container/tmpfs's BasePath, Slurm's TmpFS):
    # ``<base>/corral-<cluster>-<hash>-<node>/<job>.<attempt>``; "" = none (the job's own TMPDIR, or /tmp)
    tmpdir_base: str = "/tmp"

    def service_account(self, name: str) -> ServiceAccount | None:
        """The service account called ``name``, or None."""
        return next((sa for sa in self.service_accounts if sa.name == name), None)

    def coordinates(self, user: str, account: str) -> bool:
        """Whether ``user`` coordinates ``account``: a coordinator of it or of an account above it."""
        seen: set[str] = set()
        found = self.account(account)
        while found is not None and found.name not in seen:
            if user in found.coordinators:
                return True
            seen.add(found.name)
            found = self.account(found.parent)
        return False

    def qos_named(self, name: str) -> QosPolicy | None:
        """The QOS called ``name``, or None."""
        return next((q for q in self.qos if q.name == name), None)

    def account(self, name: str) -> AccountConfig | None:
        """The account called ``name``, or None."""
        return self._account_named.get(name)

    def node(self, name: str) -> NodeConfig:
        """The node called ``name``; KeyError if not configured."""
        return self.nodes[self.node_index[name]]

    @cached_property
    def node_index(self) -> dict[str, int]:
        """Each node's place in ``nodes``, by name (asked per node: a cluster has thousands)."""
        return {node.name: k for k, node in enumerate(self.nodes)}

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Every node's name, sorted (sinfo's order, paged by name)."""
        return tuple(sorted(self.node_index))

    @cached_property
    def _partitions_by_node(self) -> dict[str, list[str]]:
        """The partitions of each node that is in one, in config order."""
        out: dict[str, list[str]] = {}
        for part in self.partitions:
            for node in dict.fromkeys(part.nodes):
                out.setdefault(node, []).append(part.name)
        return out

    def block_map(self) -> dict[str, str]:
        """Node name -> its block's name, for the nodes in a ``[[blocks]]`` table."""
        return {node: block.name for block in self.blocks for node in block.nodes}

    def partitions_of(self, node: str) -> list[str]:
        """Names of the partitions a node belongs to."""
        return list(self._partitions_by_node.get(node, ()))

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


def _health_check_program(cluster: dict[str, Any]) -> str:
    """``cluster.health_check_program``: an absolute path (agents run it as root, so never a PATH lookup)."""
    return _absolute_path(cluster, "health_check_program", "", "give the program's full path")


def _tmpdir_base(cluster: dict[str, Any]) -> str:
    """``cluster.tmpdir_base``: an absolute path (each agent makes its runs' TMPDIRs under it), or ""."""
    return _absolute_path(cluster, "tmpdir_base", "/tmp", 'give one (e.g. "/tmp"), or "" for none')


def _absolute_path(cluster: dict[str, Any], key: str, default: str, fix: str) -> str:
    """``cluster.<key>``: "" or an absolute path; ConfigError naming the key and ``fix`` otherwise."""
    value = str(cv.optional(cluster, key, "cluster", str, default))
    if value and not value.startswith("/"):
        raise ConfigError(f"cluster.{key}: {value!r} is not an absolute path; {fix}")
    return value


def parse_config(
    text: str, source: str = "<string>", scheduler: Mapping[str, Any] | None = None
) -> ClusterConfig:
    """Parse and validate a cluster configuration; ``scheduler`` keys replace the file's ``[scheduler]``
    ones before validation (``corral sim --set``)."""
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
    nodes = parse_nodes(doc.get("nodes"))
    config = ClusterConfig(
        name=name,
        nodes=tuple(nodes),
        partitions=tuple(parse_partitions(doc.get("partitions"), nodes)),
        scheduler=parse_scheduler(doc.get("scheduler", {})),
        accounting=parse_accounting(doc.get("accounting", {})),
        accounts=parse_accounts(doc.get("accounts")),
        blocks=parse_blocks(doc.get("blocks"), nodes),
        heartbeat_interval_s=cv.seconds(cluster.get("heartbeat_interval", 2), "cluster.heartbeat_interval"),
        node_timeout_s=cv.seconds(cluster.get("node_timeout", 10), "cluster.node_timeout"),
        kill_wait_s=cv.seconds(cluster.get("kill_wait", 5), "cluster.kill_wait"),
        constrain_ram_space=cv.optional(cluster, "constrain_ram_space", "cluster", bool, False),
        cgroup_root=_cgroup_root(cluster),
        source=source,
        qos=parse_qos(doc.get("qos")),
        admins=user_names(cluster, "admins", "cluster"),
        allow_root_jobs=cv.optional(cluster, "allow_root_jobs", "cluster", bool, False),
        service_accounts=parse_service_accounts(doc.get("service_accounts"), nodes),
        health_check_program=_health_check_program(cluster),
        health_check_interval_s=cv.seconds(
            cluster.get("health_check_interval", 60), "cluster.health_check_interval"
        ),
        health_failure_action=cv.choice(  # type: ignore[arg-type]
            cluster, "health_failure_action", FAILURE_ACTIONS, "cluster"
        ),
        enforce_part_limits=cv.choice(cluster, "enforce_part_limits", ENFORCE_PART_LIMITS, "cluster"),
        tmpdir_base=_tmpdir_base(cluster),
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


def local_config_text(
    name: str,
    nodes: list[str],
    gpus_per_node: int,
    cpus: int,
    mem_mb: int,
    gpu_type: str = "sim",
    accounting_partitions: int = 1,
    allow_root_jobs: bool = False,
    node_timeout: int = 6,
    backfill_resolution: int | None = None,
) -> str:
    """The configuration ``corral up`` writes for a local cluster of simulated GPU nodes (and ``corral deploy
    init`` for real ones, with their ``gpu_type``); ``accounting_partitions`` > 1 shares the accounting
    projection among that many processes (``corral up --ha`` runs two); ``allow_root_jobs`` lets root submit
    (``corral up`` started by root, whose every job is root's; never ``corral deploy init``). ``corral demo``
    shortens ``node_timeout`` (seconds) and plans backfill to the second (``backfill_resolution``; None
    keeps the scheduler's default)."""
    names = hostlist.compress(nodes)
    accounting = (
        f"\n[accounting]\npartitions = {accounting_partitions}\n" if accounting_partitions > 1 else ""
    )
    root = "allow_root_jobs = true\n" if allow_root_jobs else ""
    planner = (
        f"\n[scheduler]\nbackfill_resolution = {backfill_resolution}\n"
        if backfill_resolution is not None
        else ""
    )
    return (
        f'[cluster]\nname = "{name}"\nheartbeat_interval = 1\nnode_timeout = {node_timeout}\nkill_wait = 3\n'
        "constrain_ram_space = true\n"
        f"{root}"
        f"{accounting}{planner}\n"
        f'[[nodes]]\nnames = "{names}"\ncpus = {cpus}\nmemory = "{mem_mb}M"\n'
        f'gpus = {gpus_per_node}\ngpu_type = "{gpu_type}"\n\n'
        f'[[partitions]]\nname = "gpu"\nnodes = "{names}"\ndefault = true\n'
        f'max_time = "UNLIMITED"\n'
    )
