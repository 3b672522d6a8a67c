"""The ``[[service_accounts]]`` tables: systems around the cluster and their scopes (``libs/core/scopes.py``).

Example (``corral serviceaccount add`` writes such a table; ``docs/configuration.md`` documents each key)::

    [[service_accounts]]
    name = "ci"
    submit_for_accounts = ["ml-platform"]   # any user of ml-platform, charged to ml-platform
    submit_for_users = ["alice"]            # alice, into any account alice may use
    report_health_nodes = "gpu[001-004]"    # a Slurm hostlist of configured nodes
    read_feed = true

The cluster file is where they live, as accounts and admins do: the gateway (submissions on behalf) and
health (health reports) read their scopes from it at start, and ``corral up`` gives each its NATS user.
"""

from __future__ import annotations

from typing import Any

from corral.libs.config import values as cv
from corral.libs.config.tables import NodeConfig, user_names
from corral.libs.config.values import ConfigError
from corral.libs.core.scopes import ServiceAccount
from corral.libs.slurm import hostlist
from corral.libs.slurm.errors import FormatError
from corral.schemas.subjects import valid_token


def parse_service_accounts(raw: Any, nodes: list[NodeConfig]) -> tuple[ServiceAccount, ...]:
    """Every ``[[service_accounts]]`` table: unique valid names, nodes that are configured."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError("service_accounts: expected a list of [[service_accounts]] tables")
    known = {n.name for n in nodes}
    out: list[ServiceAccount] = []
    for i, entry in enumerate(raw):
        where = f"service_accounts[{i}]"
        table = cv.table(entry, where)
        name = cv.require(table, "name", where, str)
        if not valid_token(name) or len(name) > 32:
            raise ConfigError(
                f"{where}.name: {name!r} is not a valid service account name "
                "(letters, digits, - _; at most 32)"
            )
        if any(sa.name == name for sa in out):
            raise ConfigError(f"{where}.name: service account {name!r} is defined twice")
        nodes_text = cv.optional(table, "report_health_nodes", where, str, "")
        try:
            report = (
                tuple(hostlist.expand(nodes_text, field=f"{where}.report_health_nodes")) if nodes_text else ()
            )
        except FormatError as exc:
            raise ConfigError(str(exc)) from None
        unknown = [n for n in report if n not in known]
        if unknown:
            raise ConfigError(
                f"{where}.report_health_nodes: {hostlist.compress(unknown)} not in any [[nodes]] table"
            )
        out.append(
            ServiceAccount(
                name=name,
                submit_accounts=user_names(table, "submit_for_accounts", where),
                submit_users=user_names(table, "submit_for_users", where),
                report_nodes=report,
                read_feed=cv.optional(table, "read_feed", where, bool, False),
            )
        )
    return tuple(out)


def service_account_table(sa: ServiceAccount) -> str:
    """The TOML text of one ``[[service_accounts]]`` table (what ``corral serviceaccount add`` appends)."""

    def strings(values: tuple[str, ...]) -> str:
        return "[" + ", ".join(f'"{v}"' for v in values) + "]"

    lines = ["[[service_accounts]]", f'name = "{sa.name}"']
    if sa.submit_accounts:
        lines.append(f"submit_for_accounts = {strings(sa.submit_accounts)}")
    if sa.submit_users:
        lines.append(f"submit_for_users = {strings(sa.submit_users)}")
    if sa.report_nodes:
        lines.append(f'report_health_nodes = "{hostlist.compress(list(sa.report_nodes))}"')
    if sa.read_feed:
        lines.append("read_feed = true")
    return "\n".join(lines) + "\n"


def without_service_account(text: str, name: str) -> str:
    """The cluster file's text without the ``[[service_accounts]]`` table named ``name`` (from its header
    to the next table's header); ConfigError if there is none."""
    import tomllib

    lines = text.splitlines(keepends=True)
    out: list[str] = []
    block: list[str] | None = None
    found = False

    def flush() -> None:
        nonlocal block, found
        if block is None:
            return
        body = tomllib.loads("".join(block[1:]))
        if body.get("name") == name and not found:
            found = True
        else:
            out.extend(block)
        block = None

    for line in lines:
        header = line.strip()
        if header.startswith("["):
            flush()
            if header == "[[service_accounts]]":
                block = [line]
                continue
        if block is not None:
            block.append(line)
        else:
            out.append(line)
    flush()
    if not found:
        raise ConfigError(f"service account {name!r} is not in the cluster file")
    return "".join(out)
