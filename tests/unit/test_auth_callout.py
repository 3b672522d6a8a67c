"""The auth callout's decision (services/auth/app.py) on real NATS JWTs, with in-memory keys and revocations:
who gets a user JWT, with which permissions, and who is refused why."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import nkeys
import pytest

from corral.libs.infra import roles
from corral.libs.runtime import nats_jwt, tickets
from corral.services.auth.app import Callout, Refused, server_request

NOW = 1_800_000_000.0
KEYS = tickets.KeyFile(keys=[tickets.Key(id="k1", secret="c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3I")])
ISSUER = nats_jwt.new_account_seed()
SERVER = bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_SERVER))


def request(user: str, password: str) -> bytes:
    """An authorization request as nats-server signs it."""
    server_id = nats_jwt.public_key(SERVER)
    claims = {
        "aud": "nats-authorization-request",
        "sub": nats_jwt.public_key(ISSUER),
        "nats": {
            "server_id": {"name": "n1", "host": "127.0.0.1", "id": server_id},
            "user_nkey": "UDMQXHHIOAEZFGQ4Y7MR3NQKS5PSJHENB5FZUG3TO235PJ4OJEG6HHWM",
            "client_info": {"host": "10.0.0.7"},
            "connect_opts": {"user": user, "pass": password},
            "type": "authorization_request",
            "version": 2,
        },
    }
    return nats_jwt.encode(claims, SERVER).encode()


def decide(user: str, password: str, revoked: frozenset[str] = frozenset()) -> dict[str, Any]:
    async def is_revoked(name: str) -> bool:
        return name in revoked

    callout = Callout(lambda: KEYS, ISSUER, is_revoked, clock=lambda: NOW)
    return nats_jwt.decode(asyncio.run(callout.answer(server_request(request(user, password)))))


def test_a_valid_ticket_gets_exactly_a_persons_permissions() -> None:
    token = decide("alice", tickets.issue(KEYS, "alice", 1001, now=NOW))
    publish, subscribe = roles.person_permissions("alice")
    assert token["iss"] == nats_jwt.public_key(ISSUER) and token["aud"] == nats_jwt.GLOBAL_ACCOUNT
    assert token["name"] == "alice" and token["sub"].startswith("U")
    assert token["nats"]["pub"] == {"allow": publish} and token["nats"]["sub"] == {"allow": subscribe}


@pytest.mark.parametrize(
    ("user", "password", "revoked", "reason"),
    [
        pytest.param("alice", "", frozenset(), "no_ticket", id="no password"),
        pytest.param("corral-admin", "x", frozenset(), "invalid_user", id="a service's name"),
        pytest.param(
            "bob", tickets.issue(KEYS, "alice", 1001, now=NOW), frozenset(), "wrong_user", id="borrowed"
        ),
        pytest.param("alice", tickets.issue(KEYS, "alice", 1, now=NOW), {"alice"}, "revoked", id="revoked"),
    ],
)
def test_a_login_that_proves_nothing_is_refused(
    user: str, password: str, revoked: frozenset[str], reason: str
) -> None:
    with pytest.raises(Refused) as info:
        decide(user, password, frozenset(revoked))
    assert info.value.reason == reason


def test_a_request_not_signed_by_its_server_is_refused() -> None:
    header, claims, _ = request("alice", "x").decode().split(".")
    forged = f"{header}.{claims}.{nats_jwt.encode({}, SERVER).split('.')[2]}"
    with pytest.raises(Refused, match="bad_request"):
        server_request(forged.encode())
