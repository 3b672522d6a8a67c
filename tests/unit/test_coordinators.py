"""Who may control a job: its owner, an admin (``--admin`` or ``[cluster] admins``), or a coordinator of its
account or of an account above it (``[[accounts]] coordinators``), configured, not one role name."""

from __future__ import annotations

import pytest

from corral.libs.config.cluster import ConfigError, parse_config
from corral.libs.runtime.clock import FakeClock
from corral.libs.runtime.errors import Forbidden
from corral.libs.runtime.memapi import MemApi
from corral.libs.runtime.memlog import MemLog
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.gateway import control
from corral.services.gateway.app import Gateway
from tests.unit.builders import job

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

CONFIG = """
[cluster]
name = "test"
admins = ["root-ops"]

[[nodes]]
names = "gpu[01-02]"
cpus = 8
memory = "16G"
gpus = 4

[[accounts]]
name = "ml"
coordinators = ["lead"]

[[accounts]]
name = "vision"
parent = "ml"
users = ["alice", "carol"]
coordinators = ["vlead"]

[[accounts]]
name = "nlp"
users = ["bob"]
"""


def gateway() -> tuple[Gateway, MemLog]:
    log = MemLog(actor="gateway")
    return Gateway(log, log, MemApi("gateway"), parse_config(CONFIG), FakeClock()), log


async def submit(gw: Gateway, user: str, token: str) -> int:
    reply = await gw.submit(user, api.SubmitRequest(token=token, spec=job(gpus=1, nodes=1, time_s=3600)))
    assert isinstance(reply, api.SubmitReply), reply
    return reply.job_id


def test_the_rule_walks_up_the_account_tree() -> None:
    config = parse_config(CONFIG)
    assert config.admins == ("root-ops",)
    assert config.coordinates("vlead", "vision") and config.coordinates("lead", "vision")
    assert config.coordinates("lead", "ml") and not config.coordinates("vlead", "ml")
    assert not config.coordinates("lead", "nlp") and not config.coordinates("alice", "vision")
    submitted = ev.JobSubmitted(job_id=ev.JobId(1), user="alice", spec=job(gpus=1, nodes=1, account="vision"))
    allowed = [
        u
        for u in ("alice", "carol", "bob", "lead", "vlead", "x")
        if control.may_control(u, submitted, config, frozenset({"x"}))
    ]
    assert allowed == ["alice", "lead", "vlead", "x"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('admins = "root"', "cluster.admins: expected a list of strings"),
        ('admins = ["no spaces"]', "cluster.admins: 'no spaces' is not a valid user name"),
    ],
)
def test_bad_admins_are_refused_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(CONFIG.replace('admins = ["root-ops"]', text))


async def test_a_coordinator_controls_the_accounts_jobs_and_no_other() -> None:
    gw, log = gateway()
    alices = await submit(gw, "alice", "a")  # charged to vision, her first account
    bobs = await submit(gw, "bob", "b")  # nlp
    assert [o.error for o in (await gw.hold("vlead", api.HoldRequest(job_ids=[alices]))).outcomes] == [None]
    assert [o.error for o in (await gw.hold("vlead", api.HoldRequest(job_ids=[bobs]))).outcomes] == [
        control.DENIED
    ]
    with pytest.raises(Forbidden):
        await gw.cancel("carol", api.CancelRequest(job_ids=[alices]))  # same account, not its coordinator
    await gw.cancel("lead", api.CancelRequest(job_ids=[alices]))  # coordinates ml, above vision
    await gw.cancel("root-ops", api.CancelRequest(job_ids=[bobs]))  # an admin from the config
    cancels = log.bodies("corral.evt.job.*.job_cancel_requested")
    assert [(c.job_id, c.user) for c in cancels] == [(alices, "lead"), (bobs, "root-ops")]


async def test_a_coordinator_may_not_raise_a_time_limit_or_set_a_priority() -> None:
    gw, _ = gateway()
    alices = await submit(gw, "alice", "a")
    shorter = await gw.update("vlead", api.UpdateRequest(job_id=alices, time_limit_s=60))
    assert [o.error for o in shorter.outcomes] == [None]
    for req in (
        api.UpdateRequest(job_id=alices, time_limit_s=10**6),
        api.UpdateRequest(job_id=alices, priority=9),
    ):
        assert [o.error for o in (await gw.update("vlead", req)).outcomes] == [control.DENIED]
