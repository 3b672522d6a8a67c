"""Tickets (libs/runtime/tickets.py): what the auth callout accepts, with an injected clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.libs.runtime import tickets

NOW = 1_800_000_000.0


@pytest.fixture
def keyfile(tmp_path: Path) -> Path:
    path = tmp_path / "ticket.key"
    tickets.ensure_keys(path)
    return path


def test_a_fresh_ticket_verifies_for_its_user(keyfile: Path) -> None:
    keys = tickets.read_keys(keyfile)
    claims = tickets.verify(keys, tickets.issue(keys, "alice", 1001, now=NOW), "alice", now=NOW + 10)
    assert (claims.user, claims.uid, claims.exp) == ("alice", 1001, int(NOW) + tickets.TTL_S)
    assert (keyfile.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize(
    ("ticket", "user", "at", "reason"),
    [
        pytest.param("hunter2", "alice", NOW, "malformed", id="a password"),
        pytest.param("alice-ticket", "bob", NOW, "wrong_user", id="another user's"),
        pytest.param("alice-ticket", "alice", NOW + tickets.TTL_S, "expired", id="expired"),
        pytest.param("tampered", "alice", NOW, "bad_signature", id="tampered claims"),
        pytest.param("other-key", "alice", NOW, "bad_signature", id="another cluster's key"),
    ],
)
def test_a_ticket_that_proves_nothing_is_refused(
    keyfile: Path, tmp_path: Path, ticket: str, user: str, at: float, reason: str
) -> None:
    keys = tickets.read_keys(keyfile)
    genuine = tickets.issue(keys, "alice", 1001, now=NOW)
    other = tmp_path / "other.key"
    tickets.ensure_keys(other)
    forged = tickets.issue(
        tickets.KeyFile([tickets.Key(keys.keys[0].id, tickets.read_keys(other).keys[0].secret)]),
        "alice",
        1001,
        now=NOW,
    )
    head, key_id, _, mac = genuine.split(".")
    cases = {
        "alice-ticket": genuine,
        "tampered": ".".join([head, key_id, tickets.issue(keys, "root", 0, now=NOW).split(".")[2], mac]),
        "other-key": forged,
    }
    with pytest.raises(tickets.TicketError) as info:
        tickets.verify(keys, cases.get(ticket, ticket), user, now=at)
    assert info.value.reason == reason


def test_a_rotated_key_verifies_until_its_grace_ends(keyfile: Path) -> None:
    old = tickets.issue(tickets.read_keys(keyfile), "alice", 1001, now=NOW)
    keys = tickets.rotate(keyfile, grace_s=60, now=NOW)
    new = tickets.issue(keys, "alice", 1001, now=NOW)
    assert tickets.verify(keys, old, "alice", now=NOW + 30).user == "alice"
    with pytest.raises(tickets.TicketError, match="bad_signature"):
        tickets.verify(keys, old, "alice", now=NOW + 61)
    assert tickets.verify(keys, new, "alice", now=NOW + 61).user == "alice"
    # The next rotation drops the retired key for good.
    keys = tickets.rotate(keyfile, grace_s=60, now=NOW + 120)
    assert len(keys.keys) == 2 and keys.keys[1].retire_at == int(NOW) + 180
