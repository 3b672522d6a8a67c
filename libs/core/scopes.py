"""Service accounts and what each may do: the one rule the gateway, health and the NATS roles apply.

A service account is a system around the cluster (a CI system, a DCGM exporter, a cost dashboard), not a
person: it authenticates as the NATS user ``svc-<name>`` (``login``) and may, within its scope,

- submit jobs on behalf of the users it lists, or of any user into an account it lists
  (``--submit-for user=alice``, ``--submit-for account=ml-platform``): the job is the user's, charged to
  an account that user may use, and the service account is recorded as its submitter (``may_submit_for``);
- report the health of the nodes it lists (``--report-health nodes=gpu[001-004]``, ``may_report``);
- read the job event feed (``--read-feed``).

A node's own agent may report its own node's health (its health-check program), and nobody else's.
Pure: the scopes come from the cluster configuration (``[[service_accounts]]``, ``libs/config``).
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.libs.slurm import hostlist

#: The NATS user name of a service account is this prefix and its name (persons may not use it).
PREFIX = "svc-"
#: The NATS user name prefix of an agent (``agent-<node>``), which may report its own node's health.
AGENT_PREFIX = "agent-"


@dataclass(frozen=True)
class ServiceAccount:
    """One service account's scope (``[[service_accounts]]`` in the cluster file)."""

    name: str  # its name (``ci``); its NATS user is ``svc-<name>``
    submit_accounts: tuple[str, ...] = ()  # accounts it may submit into, for their users
    submit_users: tuple[str, ...] = ()  # users it may submit for, into their own accounts
    report_nodes: tuple[str, ...] = ()  # nodes whose health it may report
    read_feed: bool = False  # may read the job event feed (its scope: the jobs it may submit)

    @property
    def login(self) -> str:
        """Its NATS user name."""
        return login(self.name)

    def scope_text(self) -> str:
        """Its scope in words, for errors and ``corral serviceaccount list``."""
        parts = [f"account={a}" for a in self.submit_accounts] + [f"user={u}" for u in self.submit_users]
        words = [f"submit-for {','.join(parts)}" if parts else "no submit-for"]
        if self.report_nodes:
            words.append(f"report-health nodes={hostlist.compress(list(self.report_nodes))}")
        if self.read_feed:
            words.append("read-feed")
        return "; ".join(words)


def login(name: str) -> str:
    """The NATS user name of the service account ``name``."""
    return f"{PREFIX}{name}"


def account_of_login(user: str, accounts: tuple[ServiceAccount, ...]) -> ServiceAccount | None:
    """The service account whose NATS user is ``user``, or None (a person, or a service role)."""
    if not user.startswith(PREFIX):
        return None
    return next((sa for sa in accounts if sa.login == user), None)


def submit_problem(sa: ServiceAccount, user: str, account: str, user_may_use: bool) -> str | None:
    """Why ``sa`` may not submit a job for ``user`` charged to ``account``, or None if it may.

    ``user_may_use``: whether ``user`` may charge ``account`` themself (the account's association); a
    service account never gives a user an account they do not have.
    """
    if account not in sa.submit_accounts and user not in sa.submit_users:
        return (
            f"service account {sa.name!r} may not submit for user {user!r} into account {account!r}: "
            f"its scope is {sa.scope_text()}"
        )
    if not user_may_use:
        return f"user {user!r} may not use account {account!r}"
    return None


def sees_job(sa: ServiceAccount, user: str, account: str) -> bool:
    """Whether ``sa`` may read the feed events of a job of ``user`` charged to ``account``: with
    ``read_feed``, the jobs its submit scope covers (for the job event feed)."""
    return sa.read_feed and (account in sa.submit_accounts or user in sa.submit_users)


def report_problem(reporter: str, node: str, accounts: tuple[ServiceAccount, ...]) -> str | None:
    """Why ``reporter`` (a NATS user) may not report ``node``'s health, or None if it may."""
    if reporter == f"{AGENT_PREFIX}{node}":
        return None
    if reporter.startswith(AGENT_PREFIX):
        return f"agent {reporter!r} may report only its own node's health, not {node!r}"
    sa = account_of_login(reporter, accounts)
    if sa is None:
        return f"{reporter!r} is not a service account with a report-health scope"
    if node not in sa.report_nodes:
        return (
            f"service account {sa.name!r} may not report the health of node {node!r}: its scope is "
            f"{sa.scope_text()}"
        )
    return None
