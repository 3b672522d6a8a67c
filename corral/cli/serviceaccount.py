"""``corral serviceaccount add|list|remove``: the systems around a cluster (CI, a DCGM exporter, a dashboard).

    corral serviceaccount add ci --submit-for account=ml-platform [--submit-for user=alice]
    corral serviceaccount add dcgm --report-health nodes='gpu[001-004]'
    corral serviceaccount list
    corral serviceaccount remove ci

An admin's command, run where the cluster's state directory is (``--state-dir``; who can write its
``cluster.toml`` is an admin). ``add`` appends a ``[[service_accounts]]`` table to the cluster file (the
whole file is validated first: nothing is written if it would not load) and writes the service account's
credentials file, 0600, under ``credentials/service-accounts/``: hand that file to the system, as
``CORRAL_CREDENTIALS``. The cluster gives it its NATS user (``svc-<name>``, ``roles.service_account_user``)
at its next start; the gateway and health read its scope at theirs. ``remove`` deletes the table and the
credentials file; the NATS user is gone at the next start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from corral.cli.local_cluster import service_account_credentials
from corral.libs.config.cluster import ConfigError, load_config, parse_config
from corral.libs.config.service_accounts import service_account_table, without_service_account
from corral.libs.config.settings import default_state_dir
from corral.libs.core.scopes import ServiceAccount
from corral.libs.infra import roles
from corral.libs.runtime.credentials import Credentials, new_password, read_credentials, write_credentials
from corral.libs.slurm import hostlist
from corral.libs.slurm.errors import FormatError

APPLY = "it takes effect at the cluster's next start (corral up)"


def main(argv: list[str]) -> int:
    """Entry point of ``corral serviceaccount``."""
    parser = argparse.ArgumentParser(prog="corral serviceaccount", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", default=str(default_state_dir()), help="the cluster's state directory")
    sub = parser.add_subparsers(dest="action", required=True)
    add = sub.add_parser("add", help="add a service account and write its credentials file")
    add.add_argument("name", help="its name (its NATS user is svc-NAME)")
    add.add_argument(
        "--submit-for",
        action="append",
        default=[],
        metavar="account=NAME|user=NAME",
        help="may submit jobs for the users of this account, or for this user (repeatable)",
    )
    add.add_argument("--report-health", metavar="nodes=HOSTLIST", help="may report these nodes' health")
    add.add_argument("--read-feed", action="store_true", help="may read the job event feed")
    sub.add_parser("list", help="the service accounts and their scopes")
    remove = sub.add_parser("remove", help="remove a service account and its credentials file")
    remove.add_argument("name")
    args = parser.parse_args(argv)
    state = Path(args.state_dir)
    try:
        if args.action == "add":
            return _add(state, _account(args))
        if args.action == "list":
            return _list(state)
        return _remove(state, args.name)
    except ConfigError as exc:
        print(f"corral serviceaccount: error: {exc}", file=sys.stderr)
        return 1


def _account(args: argparse.Namespace) -> ServiceAccount:
    """The service account the options describe; ConfigError naming the option at fault."""
    accounts, users = [], []
    for value in args.submit_for:
        kind, _, name = value.partition("=")
        if kind == "account" and name:
            accounts.append(name)
        elif kind == "user" and name:
            users.append(name)
        else:
            raise ConfigError(f"--submit-for: {value!r} is not account=NAME or user=NAME")
    nodes: tuple[str, ...] = ()
    if args.report_health is not None:
        kind, _, text = args.report_health.partition("=")
        if kind != "nodes" or not text:
            raise ConfigError(f"--report-health: {args.report_health!r} is not nodes=HOSTLIST")
        try:
            nodes = tuple(hostlist.expand(text, field="--report-health"))
        except FormatError as exc:
            raise ConfigError(str(exc)) from None
    return ServiceAccount(
        name=args.name,
        submit_accounts=tuple(accounts),
        submit_users=tuple(users),
        report_nodes=nodes,
        read_feed=args.read_feed,
    )


def _config_path(state: Path) -> Path:
    path = state / "cluster.toml"
    if not path.exists():
        raise ConfigError(f"no cluster configuration at {path}: start the cluster once, or give --state-dir")
    return path


def _add(state: Path, sa: ServiceAccount) -> int:
    path = _config_path(state)
    text = path.read_text()
    if load_config(path).service_account(sa.name) is not None:
        raise ConfigError(f"service account {sa.name!r} exists already; remove it first to change it")
    new_text = text.rstrip("\n") + "\n\n" + service_account_table(sa)
    parse_config(new_text, source=str(path))  # the whole file still loads, or nothing is written
    creds_path = service_account_credentials(state, sa.name)
    admin = state / "credentials" / "roles" / f"{roles.ADMIN}.json"
    url = read_credentials(admin).url if admin.exists() else ""
    write_credentials(creds_path, Credentials(url=url, user=sa.login, password=new_password()))
    path.write_text(new_text)
    print(f"service account {sa.name!r} added ({sa.scope_text()}); credentials in {creds_path}; {APPLY}")
    return 0


def _list(state: Path) -> int:
    config = load_config(_config_path(state))
    for sa in config.service_accounts:
        print(f"{sa.name:<16} {sa.login:<20} {sa.scope_text()}")
    return 0


def _remove(state: Path, name: str) -> int:
    path = _config_path(state)
    new_text = without_service_account(path.read_text(), name)
    parse_config(new_text, source=str(path))
    path.write_text(new_text)
    service_account_credentials(state, name).unlink(missing_ok=True)
    print(f"service account {name!r} removed; {APPLY}")
    return 0
