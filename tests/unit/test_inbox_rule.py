"""The reply-inbox rule: a service answers a request only under the caller's own inbox."""

from __future__ import annotations

import pytest

from corral.schemas import subjects

CASES = {
    "the caller's inbox": ("alice", "_INBOX.alice.x1.2", True),
    "another user's inbox": ("alice", "_INBOX.bob.x1.2", False),
    "the bare prefix": ("alice", "_INBOX.alice", False),
    "a prefix of another name": ("ali", "_INBOX.alice.x1", False),
    "the job id counter": ("alice", "$KV.corral_ids.job_id", False),
    "the log": ("alice", "corral.evt.job.7.job_allocated", False),
    "a heartbeat": ("alice", "corral.hb.node2", False),
    "a caller that is no token": ("a.b", "_INBOX.a.b.x", False),
}


@pytest.mark.parametrize(("caller", "reply", "allowed"), list(CASES.values()), ids=list(CASES))
def test_own_inbox(caller: str, reply: str, allowed: bool) -> None:
    assert subjects.own_inbox(caller, reply) is allowed


def test_every_inbox_is_one_wildcard_token() -> None:
    assert subjects.inbox_prefix("alice") == "_INBOX.alice"
    assert subjects.INBOXES == "_INBOX.*.>"
