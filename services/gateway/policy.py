"""Submit-time QOS, partition and association checks (pure): a job that breaks one is refused (Slurm's words).

``check_submitter`` refuses a job of root unless ``[cluster] allow_root_jobs`` (Slurm's DisableRootJobs): a
job runs as its submitter, and root's would run as root ("Access/permission denied").

``check_account`` refuses an account (``-A``) that does not exist or that the user may not charge →
"Invalid account or account/partition combination specified".

``check_policy`` takes a spec whose partition, account and QOS the gateway has resolved and refuses:

- a QOS that does not exist, or that the partition does not allow (AllowQos) → "Invalid qos specification";
- an account the partition does not allow (AllowAccounts) → "Invalid account or account/partition
  combination specified";
- more nodes than the partition's MaxNodes → "Node count specification invalid" (unless `[cluster]
  enforce_part_limits = "NO"`: then it pends with PartitionNodeLimit);
- a time limit over the QOS's MaxWall, more GPUs than a QOS or association GPU limit could ever let one
  user run, or a job-count limit of 0 → "Job violates accounting/QOS policy (job submit limit, user's size
  and/or time limits)";
- a negative nice from anyone but an administrator → "Access/permission denied".

``submit_limits`` lists the MaxSubmitJobs limits (the QOS's per user, the association's) that apply;
``check_submit_count`` refuses the job when the user's pending and running jobs, as the scheduler counts
them, plus this submission's jobs (an array's every task) would exceed one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corral.libs.config.cluster import ClusterConfig, PartitionConfig
from corral.libs.core.qos import AssocLimits, QosPolicy
from corral.libs.runtime.errors import Forbidden, InvalidInput
from corral.schemas.events import JobSpec
from corral.schemas.job_spec import MAX_NICE

INVALID_QOS = "Invalid qos specification"
INVALID_ACCOUNT = "Invalid account or account/partition combination specified"
NODE_COUNT = "Node count specification invalid"
ACCOUNTING_POLICY = "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"


def resolve_qos(spec: JobSpec, config: ClusterConfig) -> str:
    """The QOS a job gets: its own ``--qos``, else its partition's QOS, else the default QOS."""
    if spec.qos:
        return spec.qos
    part = _partition(spec, config)
    return part.qos or config.scheduler.default_qos


def _partition(spec: JobSpec, config: ClusterConfig) -> PartitionConfig:
    return (config.partition(spec.partition) if spec.partition else None) or config.default_partition


def account_chain(config: ClusterConfig, account: str) -> list[AssocLimits]:
    """Limits of the account and of each account above it (those that have any)."""
    parents = {a.name: a.parent for a in config.accounts}
    out: list[AssocLimits] = []
    name: str | None = account
    seen: set[str] = set()
    while name is not None and name not in seen:
        seen.add(name)
        found = config.account(name)
        if found is not None and found.limits is not None:
            out.append(found.limits)
        name = parents.get(name)
    return out


#: The superuser's name: its jobs would run as root.
ROOT = "root"


def check_submitter(user: str, config: ClusterConfig) -> None:
    """Raise Forbidden for a job of root on a cluster that does not allow root's jobs (the default): jobs run
    as their submitter, so root's would run with every right on the node. The agent refuses any uid 0 too
    (a second name for it), whatever the gateway let through."""
    if user == ROOT and not config.allow_root_jobs:
        raise Forbidden(
            "Access/permission denied: root may not submit jobs here (a job runs as its submitter): "
            "set [cluster] allow_root_jobs = true in the cluster configuration to allow it"
        )


def check_account(account: str, user: str, config: ClusterConfig) -> None:
    """Raise InvalidInput (field ``account``) unless ``user`` may charge ``account``
    (``ClusterConfig.may_use``); the message names the accounts the user may use."""
    if config.may_use(user, account):
        return
    why = (
        f"{user} may not use account {account!r}"
        if config.account(account)
        else f"account {account!r} does not exist"
    )
    allowed = ", ".join(config.accounts_of(user))
    raise InvalidInput(f"{INVALID_ACCOUNT}: {why}; use {allowed} (or give no account)", field="account")


def check_policy(spec: JobSpec, user: str, config: ClusterConfig, *, admin: bool) -> None:
    """Raise InvalidInput (Forbidden for a negative nice) if the resolved spec breaks a QOS, partition or
    association rule it could never satisfy."""
    if abs(spec.nice) > MAX_NICE:
        raise InvalidInput(f"Invalid nice value {spec.nice}: must be within +/-{MAX_NICE}", field="nice")
    if spec.nice < 0 and not admin:
        raise Forbidden("Access/permission denied: only an administrator may give a negative nice value")
    part = _partition(spec, config)
    name = resolve_qos(spec, config)
    qos = config.qos_named(name)
    if qos is None:
        known = ", ".join(q.name for q in config.qos)
        raise InvalidInput(f"{INVALID_QOS}: QOS {name!r} does not exist; choose one of {known}", field="qos")
    if part.allow_qos and name not in part.allow_qos:
        raise InvalidInput(
            f"{INVALID_QOS}: partition {part.name} allows QOS {', '.join(part.allow_qos)}, not {name!r}",
            field="qos",
        )
    account = spec.account or user
    if part.allow_accounts and account not in part.allow_accounts:
        raise InvalidInput(
            f"{INVALID_ACCOUNT}: partition {part.name} allows accounts {', '.join(part.allow_accounts)}, "
            f"not {account!r}",
            field="account",
        )
    if part.max_nodes is not None and spec.nodes > part.max_nodes and config.enforce_part_limits != "NO":
        raise InvalidInput(
            f"{NODE_COUNT}: {spec.nodes} nodes requested, partition {part.name} MaxNodes={part.max_nodes}",
            field="nodes",
        )
    if spec.time_limit_s is not None and qos.max_wall_s is not None and spec.time_limit_s > qos.max_wall_s:
        raise InvalidInput(
            f"{ACCOUNTING_POLICY}: time limit {spec.time_limit_s}s over QOS {name} MaxWall {qos.max_wall_s}s",
            field="time_limit_s",
        )
    _check_size(spec, qos, account_chain(config, account), account)


@dataclass(frozen=True)
class _Cap:
    """One limit a single job must fit under."""

    limit: int | None  # the limit (None: unlimited)
    what: str  # how to name it in the message


def _check_size(spec: JobSpec, qos: QosPolicy, chain: list[AssocLimits], account: str) -> None:
    """A job larger than a limit could ever allow would wait forever: refuse it now."""
    gpus = spec.gpus_per_node * spec.nodes
    own = chain[0] if chain and chain[0].account == account else None
    gpu_caps = [
        _Cap(qos.max_gres_per_user, f"QOS {qos.name} MaxTRESPerUser=gres/gpu"),
        _Cap(qos.grp_gres, f"QOS {qos.name} GrpTRES=gres/gpu"),
        _Cap(own.max_gres_per_user if own else None, f"account {account} per-user GrpTRES=gres/gpu"),
        *(_Cap(a.grp_gres, f"account {a.account} GrpTRES=gres/gpu") for a in chain),
    ]
    for cap in gpu_caps:
        if cap.limit is not None and gpus > cap.limit:
            raise InvalidInput(
                f"{ACCOUNTING_POLICY}: {gpus} GPUs requested, {cap.what}={cap.limit}", field="gpus_per_node"
            )
    job_caps = [
        _Cap(qos.max_jobs_per_user, f"QOS {qos.name} MaxJobsPerUser"),
        _Cap(own.max_jobs_per_user if own else None, f"account {account} MaxJobs"),
        *(_Cap(a.grp_jobs, f"account {a.account} GrpJobs") for a in chain),
    ]
    for cap in job_caps:
        if cap.limit == 0:
            raise InvalidInput(f"{ACCOUNTING_POLICY}: {cap.what}=0, no job may run", field="qos")


@dataclass(frozen=True)
class SubmitLimit:
    """A MaxSubmitJobs limit on the user's pending and running jobs in one QOS or one account."""

    qos: str | None  # count the user's jobs of this QOS (None: of the account)
    account: str | None  # count the user's jobs charged to this account (None: of the QOS)
    limit: int  # most jobs
    what: str  # how to name it in the message


def submit_limits(spec: JobSpec, user: str, config: ClusterConfig) -> list[SubmitLimit]:
    """The MaxSubmitJobs limits on the resolved spec (empty: no need to count)."""
    name = resolve_qos(spec, config)
    account = spec.account or user
    out = []
    qos = config.qos_named(name)
    if qos is not None and qos.max_submit_jobs_per_user is not None:
        limit = qos.max_submit_jobs_per_user
        out.append(SubmitLimit(name, None, limit, f"QOS {name} MaxSubmitJobsPerUser={limit}"))
    found = config.account(account)
    if found is not None and found.limits is not None and found.limits.max_submit_jobs_per_user is not None:
        limit = found.limits.max_submit_jobs_per_user
        out.append(SubmitLimit(None, account, limit, f"account {account} MaxSubmitJobs={limit}"))
    return out


#: (QOS, account, jobs): how many live jobs of a user one QOS and account have.
Counted = tuple[str | None, str | None, int]


def check_submit_count(limits: list[SubmitLimit], counts: Iterable[Counted], adding: int) -> None:
    """Refuse ``adding`` more jobs when the user's live jobs (pending and running) would exceed a limit.
    ``counts``: the user's live jobs by QOS and account (the scheduler's ``live_counts``) and the submissions
    of the user accepted before this one in the same batch, which the scheduler has not seen yet."""
    counted = list(counts)
    for lim in limits:
        count = sum(
            jobs
            for qos, account, jobs in counted
            if (lim.qos is None or qos == lim.qos) and (lim.account is None or account == lim.account)
        )
        if count + adding > lim.limit:
            raise InvalidInput(
                f"{ACCOUNTING_POLICY}: you have {count} pending or running jobs, {lim.what}", field="qos"
            )
