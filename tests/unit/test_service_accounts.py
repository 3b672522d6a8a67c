"""Service accounts: their ``[[service_accounts]]`` tables, their NATS role, and the gateway's submissions on
behalf of a user (accepted within the scope, refused naming it, nothing appended)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from corral.cli import serviceaccount
from corral.libs.config.cluster import ConfigError, parse_config
from corral.libs.config.service_accounts import service_account_table, without_service_account
from corral.libs.core import scopes
from corral.libs.infra import roles
from corral.libs.runtime.clock import FakeClock
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.errors import Forbidden, InvalidInput
from corral.libs.runtime.memapi import MemApi
from corral.libs.runtime.memlog import MemLog
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.services.gateway.app import Gateway
from tests.unit.builders import job

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

BASE = """
[cluster]
name = "test"

[[nodes]]
names = "gpu[01-04]"
cpus = 8
memory = "64G"
gpus = 4

[[partitions]]
name = "gpu"
nodes = "gpu[01-04]"
default = true

[[accounts]]
name = "ml-platform"
users = ["alice", "bob"]

[[accounts]]
name = "physics"
users = ["carol", "alice"]
"""

CI = """
[[service_accounts]]
name = "ci"
submit_for_accounts = ["ml-platform"]
submit_for_users = ["dave"]
report_health_nodes = "gpu[01-02]"
read_feed = true
"""


def test_a_service_account_table_gives_its_scope() -> None:
    config = parse_config(BASE + CI)
    assert config.service_account("ci") == scopes.ServiceAccount(
        name="ci",
        submit_accounts=("ml-platform",),
        submit_users=("dave",),
        report_nodes=("gpu01", "gpu02"),
        read_feed=True,
    )
    assert config.service_account("nope") is None


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (
            'name = "ci"\nreport_health_nodes = "gpu09"',
            "service_accounts[0].report_health_nodes: gpu09 not in",
        ),
        ('name = "c i"', "service_accounts[0].name: 'c i' is not a valid service account name"),
        ('name = "ci"\nsubmit_for = ["x"]', "service_accounts[0]: unknown key 'submit_for'"),
        ('name = "ci"\nsubmit_for_users = ["a b"]', "service_accounts[0].submit_for_users: 'a b' is not"),
        ('submit_for_users = ["a"]', "service_accounts[0]: missing key 'name'"),
    ],
    ids=["unknown-node", "bad-name", "unknown-key", "bad-user", "no-name"],
)
def test_a_bad_service_account_table_is_refused_naming_the_key(table: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        parse_config(BASE + "\n[[service_accounts]]\n" + table + "\n")


def test_a_service_account_is_defined_once() -> None:
    with pytest.raises(ConfigError, match="defined twice"):
        parse_config(BASE + CI + CI)


def test_the_table_written_reads_back_and_removing_it_leaves_the_rest() -> None:
    sa = parse_config(BASE + CI).service_accounts[0]
    text = BASE + CI + '\n[[service_accounts]]\nname = "dcgm"\nreport_health_nodes = "gpu03"\n'
    assert parse_config(BASE + service_account_table(sa)).service_accounts == (sa,)
    left = without_service_account(text, "ci")
    assert [s.name for s in parse_config(left).service_accounts] == ["dcgm"]
    assert parse_config(left).accounts == parse_config(BASE).accounts
    with pytest.raises(ConfigError, match="'nope' is not in the cluster file"):
        without_service_account(text, "nope")


def test_the_role_has_the_api_as_itself_and_health_reports_on_its_own_token() -> None:
    sa = parse_config(BASE + CI).service_accounts[0]
    user = roles.service_account_user(sa, "pw")
    assert user.user == "svc-ci" and not user.allow_responses
    assert subjects.api_subject("*", "svc-ci") in user.publish
    assert subjects.health_report_subject("svc-ci", "*") in user.publish
    assert not any(p.startswith("corral.evt") for p in user.publish)
    assert user.subscribe[:2] == [f"{subjects.inbox_prefix('svc-ci')}.>", "corral.io.svc-ci.>"]
    # read_feed: the feed of the jobs it may submit, through the consumer the declaration makes for it
    scope = roles.FeedScope(users=("dave",), accounts=("ml-platform",))
    assert set(scope.filters()) <= set(user.subscribe)
    assert roles.feed_readers((sa,))["svc-ci"] == scope.filters()
    assert "svc-ci" not in roles.feed_readers((scopes.ServiceAccount(name="ci"),))
    no_reports = roles.service_account_user(scopes.ServiceAccount(name="ci"), "pw")
    assert not any(p.startswith(subjects.HEALTH_REPORT_PREFIX) for p in no_reports.publish)
    # A person may not take a service account's name.
    with pytest.raises(ValueError, match="reserved"):
        roles.user_user("svc-ci", "pw")


def gateway(log: MemLog) -> Gateway:
    return Gateway(log, log, MemApi("gateway"), parse_config(BASE + CI), FakeClock())


def request(on_behalf_of: str | None, account: str | None = None) -> api.SubmitRequest:
    return api.SubmitRequest(token="t", spec=job(nodes=1, gpus=1, account=account), on_behalf_of=on_behalf_of)


@pytest.mark.parametrize(
    ("on_behalf_of", "account", "owner", "charged"),
    [
        ("alice", "ml-platform", "alice", "ml-platform"),
        ("bob", None, "bob", "ml-platform"),  # bob's default account is in the scope
        ("dave", None, "dave", "dave"),  # a user of the scope, into their own account
    ],
    ids=["account-given", "default-account", "user-scope"],
)
async def test_a_service_account_submits_for_a_user_of_its_scope(
    on_behalf_of: str, account: str | None, owner: str, charged: str
) -> None:
    log = MemLog(actor="gateway")
    reply = await gateway(log).submit("svc-ci", request(on_behalf_of, account))
    assert isinstance(reply, api.SubmitReply)
    [submitted] = log.bodies(f"corral.evt.job.{reply.job_id}.>")
    assert isinstance(submitted, ev.JobSubmitted)
    assert (submitted.user, submitted.service_account, submitted.spec.account) == (owner, "ci", charged)


@pytest.mark.parametrize(
    ("caller", "on_behalf_of", "account", "error", "kind"),
    [
        ("svc-ci", "alice", "physics", "service account 'ci' may not submit for user 'alice' into account "
         "'physics': its scope is submit-for account=ml-platform,user=dave", Forbidden),
        ("svc-ci", "carol", None, "may not submit for user 'carol' into account 'physics'", Forbidden),
        ("svc-ci", "dave", "ml-platform", "user 'dave' may not use account 'ml-platform'", Forbidden),
        ("svc-ci", None, None, "service account 'ci' submits only on behalf of a user", Forbidden),
        ("alice", "bob", None, "alice is not a service account", Forbidden),
        ("svc-ci", "svc-ci", None, "on_behalf_of: 'svc-ci' is not a user name", InvalidInput),
        ("svc-ci", "a.b", None, "on_behalf_of: 'a.b' is not a user name", InvalidInput),
    ],
    ids=["other-account", "user-of-other-account", "account-user-cannot-use", "no-on-behalf",
         "person", "itself", "not-a-token"],
)  # fmt: skip
async def test_a_submission_on_behalf_outside_the_scope_is_refused_and_appends_nothing(
    caller: str, on_behalf_of: str | None, account: str | None, error: str, kind: type[Exception]
) -> None:
    log = MemLog(actor="gateway")
    with pytest.raises(kind, match=error):
        await gateway(log).submit(caller, request(on_behalf_of, account))
    assert log.bodies("corral.evt.>") == []


def test_the_feed_shows_a_service_account_the_jobs_of_its_scope_only() -> None:
    sa = parse_config(BASE + CI).service_accounts[0]
    assert scopes.sees_job(sa, "alice", "ml-platform") and scopes.sees_job(sa, "dave", "dave")
    assert not scopes.sees_job(sa, "alice", "physics")
    assert not scopes.sees_job(
        scopes.ServiceAccount(name="x", submit_accounts=("ml-platform",)), "a", "ml-platform"
    )


async def test_a_service_account_gets_no_admin_privilege_from_the_user_it_submits_for() -> None:
    log = MemLog(actor="gateway")
    config = parse_config(BASE.replace('name = "test"', 'name = "test"\nadmins = ["alice"]') + CI)
    gw = Gateway(log, log, MemApi("gateway"), config, FakeClock())
    spec = job(nodes=1, gpus=1, account="ml-platform", nice=-10)
    with pytest.raises(Forbidden, match="Access/permission denied"):
        await gw.submit("svc-ci", api.SubmitRequest(token="t", spec=spec, on_behalf_of="alice"))
    assert isinstance(await gw.submit("alice", api.SubmitRequest(token="t", spec=spec)), api.SubmitReply)


def test_the_command_adds_lists_and_removes_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cluster.toml").write_text(BASE)
    run = lambda *argv: serviceaccount.main(["--state-dir", str(tmp_path), *argv])  # noqa: E731
    assert run("add", "ci", "--submit-for", "account=ml-platform", "--report-health", "nodes=gpu[01-02]") == 0
    creds = tmp_path / "credentials" / "service-accounts" / "ci.json"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600 and read_credentials(creds).user == "svc-ci"
    assert parse_config((tmp_path / "cluster.toml").read_text()).service_account("ci") is not None
    capsys.readouterr()
    assert run("list") == 0
    assert capsys.readouterr().out.split() == [
        "ci", "svc-ci", "submit-for", "account=ml-platform;", "report-health", "nodes=gpu[01-02]"
    ]  # fmt: skip
    before = (tmp_path / "cluster.toml").read_text()
    for argv, error in [
        (["add", "ci"], "service account 'ci' exists already"),
        (["add", "x", "--submit-for", "group=a"], "--submit-for: 'group=a' is not account=NAME or user=NAME"),
        (["add", "x", "--report-health", "gpu01"], "--report-health: 'gpu01' is not nodes=HOSTLIST"),
        (["add", "x", "--report-health", "nodes=gpu09"], "report_health_nodes: gpu09 not in any [[nodes]]"),
        (["add", 'x"y'], "not valid TOML"),
        (["remove", "nope"], "service account 'nope' is not in the cluster file"),
    ]:
        assert run(*argv) == 1
        assert error in capsys.readouterr().err, argv
        assert (tmp_path / "cluster.toml").read_text() == before
    assert run("remove", "ci") == 0
    assert not creds.exists() and parse_config((tmp_path / "cluster.toml").read_text()).service_accounts == ()
