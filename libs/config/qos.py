"""The ``[[qos]]`` tables of the cluster configuration, and the checks that tie QOS, partitions and accounts.

Example (``docs/configuration.md`` documents every key)::

    [[qos]]
    name = "high"
    priority = 100
    max_gres_per_user = 16          # MaxTRESPerUser=gres/gpu=16
    max_wall = "2-00:00:00"
    preempt = ["low"]
    preempt_mode = "requeue"
    grace_time = 120                # seconds

A QOS ``normal`` (priority 0, no limits) always exists, as in Slurm; a ``[[qos]]`` table named
``normal`` redefines it. Every name a partition, an account or the scheduler gives must be defined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast, get_args

from corral.libs.config import values as cv
from corral.libs.config.values import ConfigError
from corral.libs.core.qos import NORMAL, PreemptMode, QosPolicy
from corral.schemas.subjects import valid_token

if TYPE_CHECKING:
    from corral.libs.config.cluster import ClusterConfig


def _grace(value: Any, where: str) -> int:
    """GraceTime: whole seconds (a number), or a Slurm duration string."""
    return cv.whole_seconds(value, where, f"must be a number of seconds, got {value!r}")


def parse_qos(raw: Any) -> tuple[QosPolicy, ...]:
    """Every QOS of the ``[[qos]]`` tables, in order, ``normal`` first unless redefined."""
    if raw is None:
        return (QosPolicy(NORMAL),)
    if not isinstance(raw, list):
        raise ConfigError("qos: expected a list of [[qos]] tables")
    out: list[QosPolicy] = []
    for i, entry in enumerate(raw):
        where = f"qos[{i}]"
        table = cv.table(entry, where)
        name = cv.optional(table, "name", where, str, "")
        if not name or not valid_token(name):
            raise ConfigError(f"{where}.name: {name!r} is not a valid QOS name (letters, digits, - _)")
        if any(q.name == name for q in out):
            raise ConfigError(f"{where}.name: QOS {name!r} is defined twice")
        mode = cv.optional(table, "preempt_mode", where, str, None)
        if mode is not None and mode not in get_args(PreemptMode):
            raise ConfigError(f"{where}.preempt_mode: {mode!r} is not one of off, requeue, cancel")
        out.append(
            QosPolicy(
                name=name,
                priority=cv.count(table, "priority", where) or 0,
                max_gres_per_user=cv.count(table, "max_gres_per_user", where),
                max_jobs_per_user=cv.count(table, "max_jobs_per_user", where),
                max_submit_jobs_per_user=cv.count(table, "max_submit_jobs_per_user", where),
                grp_gres=cv.count(table, "grp_gres", where),
                max_wall_s=cv.limit(table["max_wall"], f"{where}.max_wall") if "max_wall" in table else None,
                preempt=cv.string_list(table, "preempt", where),
                preempt_mode=cast(PreemptMode | None, mode),
                grace_time_s=_grace(table["grace_time"], f"{where}.grace_time")
                if "grace_time" in table
                else None,
            )
        )
    _check_preempt_lists(out)
    if not any(q.name == NORMAL for q in out):
        out.insert(0, QosPolicy(NORMAL))
    return tuple(out)


def _check_preempt_lists(tables: list[QosPolicy]) -> None:
    """Every QOS a ``preempt`` list names exists (``normal`` always does), and none names its own QOS."""
    names = {NORMAL, *(q.name for q in tables)}
    for i, qos in enumerate(tables):
        for target in qos.preempt:
            if target == qos.name:
                raise ConfigError(
                    f"qos[{i}].preempt: QOS {qos.name!r} cannot preempt itself; remove it from the list"
                )
            if target not in names:
                raise ConfigError(
                    f"qos[{i}].preempt: QOS {target!r} is not defined; add a [[qos]] table or use one of "
                    f"{', '.join(sorted(names))}"
                )


def check_qos_references(config: ClusterConfig) -> None:
    """Every QOS and account named by the scheduler or a partition exists (preempt lists: ``parse_qos``)."""
    names = {q.name for q in config.qos}

    def known(name: str, where: str) -> None:
        if name not in names:
            raise ConfigError(
                f"{where}: QOS {name!r} is not defined; add a [[qos]] table or use one of "
                f"{', '.join(sorted(names))}"
            )

    known(config.scheduler.default_qos, "scheduler.default_qos")
    accounts = {a.name for a in config.accounts}
    for i, part in enumerate(config.partitions):
        where = f"partitions[{i}]"
        for name in part.allow_qos:
            known(name, f"{where}.allow_qos")
        if part.qos is not None:
            known(part.qos, f"{where}.qos")
        default = part.qos or config.scheduler.default_qos
        if part.allow_qos and default not in part.allow_qos:
            raise ConfigError(
                f"{where}.allow_qos: the partition's default QOS {default!r} is not allowed in it; "
                "add it or set the partition's qos"
            )
        unknown = [a for a in part.allow_accounts if accounts and a not in accounts]
        if unknown:
            raise ConfigError(
                f"{where}.allow_accounts: account {unknown[0]!r} is not in any [[accounts]] table"
            )
