"""Who a job runs as on a node (``services/agent/identity.py``): the node's own user database decides."""

from __future__ import annotations

import os
import pwd

import pytest

from corral.services.agent.identity import Identities, UnknownIdentity
from corral.services.agent.stepdir import RunAs

pytestmark = pytest.mark.unit

NOBODY = pwd.getpwnam("nobody")


def test_an_agent_run_by_root_runs_a_job_as_its_owner_with_their_groups_and_login() -> None:
    owner = Identities("n1", allow_root_jobs=False, agent_uid=0).of("nobody")
    assert (owner.uid, owner.gid, owner.home, owner.shell) == (
        NOBODY.pw_uid,
        NOBODY.pw_gid,
        NOBODY.pw_dir,
        NOBODY.pw_shell,
    )
    assert owner.groups == tuple(os.getgrouplist("nobody", NOBODY.pw_gid))
    assert owner.run_as() == RunAs(uid=NOBODY.pw_uid, gid=NOBODY.pw_gid, groups=list(owner.groups))
    assert owner.login() == {
        "HOME": NOBODY.pw_dir,
        "USER": "nobody",
        "LOGNAME": "nobody",
        "SHELL": NOBODY.pw_shell,
    }


def test_a_user_unknown_on_the_node_cannot_run_there() -> None:
    with pytest.raises(
        UnknownIdentity, match=r"^Invalid user id: user corral-no-such-user does not exist on n1$"
    ):
        Identities("n1", allow_root_jobs=True, agent_uid=0).of("corral-no-such-user")


def test_root_runs_jobs_only_where_the_cluster_allows_it() -> None:
    with pytest.raises(UnknownIdentity, match=r"root is uid 0 and \[cluster\] allow_root_jobs is false"):
        Identities("n1", allow_root_jobs=False, agent_uid=0).of("root")
    assert Identities("n1", allow_root_jobs=True, agent_uid=0).of("root").uid == 0


def test_an_agent_that_is_not_root_runs_only_its_own_users_jobs_and_changes_nothing() -> None:
    agent = Identities("n1", allow_root_jobs=True, agent_uid=NOBODY.pw_uid)
    own = agent.of("nobody")
    assert own.run_as() is None  # the agent's identity is the job's: nothing to switch
    with pytest.raises(UnknownIdentity) as refused:
        agent.of("root")
    assert str(refused.value) == (
        "cannot run a job of root on n1: its agent runs as nobody, not root, and can run jobs only as nobody"
    )
