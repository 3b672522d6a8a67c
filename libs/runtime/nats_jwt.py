"""NATS JWTs: the nkey-signed tokens of nats-server's auth callout (ADR-26).

A NATS JWT is ``base64url(header).base64url(claims).base64url(signature)`` with the header
``{"typ":"JWT","alg":"ed25519-nkey"}``; the signature is ed25519 over the first two parts, by the key whose
public nkey is the claims' ``iss``; ``jti`` is the base32 SHA-256 of the claims without it, as the Go
library sets it.

The callout exchange (config mode, no encryption):

- the server sends, on ``$SYS.REQ.USER.AUTH``, an ``authorization_request`` signed by the server's own key:
  ``nats.server_id.id`` (the server's nkey, the response's ``aud``), ``nats.user_nkey`` (a key the server
  made up for this connection, the response's ``sub``), ``nats.connect_opts`` (``user``, ``pass``...);
- the service answers an ``authorization_response`` signed by the issuer account key named in the server's
  ``auth_callout { issuer }``, holding either ``jwt`` (a ``user`` JWT: ``sub`` the user nkey, ``aud`` the
  account the user goes into, ``$G`` in config mode, ``name``, ``pub``/``sub`` permissions, ``exp``) or
  ``error`` (the connection is refused with it).
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from typing import Any

import msgspec
import nkeys
from nacl.exceptions import BadSignatureError
from nacl.signing import VerifyKey

#: The account of every user defined in a server's ``authorization`` block (config mode).
GLOBAL_ACCOUNT = "$G"
#: The subject nats-server sends authorization requests on.
AUTH_SUBJECT = "$SYS.REQ.USER.AUTH"

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


class JwtError(ValueError):
    """A token that is not a NATS JWT, or whose signature does not verify."""


def new_account_seed() -> bytes:
    """A fresh account nkey seed (``SA...``): the callout's issuer."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))


def public_key(seed: bytes) -> str:
    """The public nkey (``A...``) of a seed."""
    return str(nkeys.from_seed(bytearray(seed)).public_key.decode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(claims: dict[str, Any], seed: bytes) -> str:
    """Sign ``claims`` (``iss`` set to the seed's public key, ``iat`` and ``jti`` added)."""
    keys = nkeys.from_seed(bytearray(seed))
    body = {**claims, "iss": keys.public_key.decode(), "iat": int(time.time())}
    body.pop("jti", None)
    digest = hashlib.sha256(msgspec.json.encode(body)).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing = f"{_b64(msgspec.json.encode(_HEADER))}.{_b64(msgspec.json.encode(body))}"
    return f"{signing}.{_b64(bytes(keys.sign(signing.encode())))}"


def decode(token: str) -> dict[str, Any]:
    """The claims of a JWT whose signature verifies against its own ``iss``; JwtError otherwise."""
    try:
        header, payload, signature = token.split(".")
        claims = msgspec.json.decode(_unb64(payload))
        if msgspec.json.decode(_unb64(header)).get("alg") != "ed25519-nkey" or not isinstance(claims, dict):
            raise JwtError("not an ed25519-nkey JWT")
        _verify_key(str(claims["iss"])).verify(f"{header}.{payload}".encode(), _unb64(signature))
    except JwtError:
        raise
    except (ValueError, KeyError, TypeError, msgspec.DecodeError, nkeys.NkeysError, BadSignatureError) as exc:
        raise JwtError(f"invalid JWT: {type(exc).__name__}") from None
    return claims


def _verify_key(public: str) -> VerifyKey:
    """The ed25519 key of a public nkey: base32 of a prefix byte, 32 key bytes and a CRC-16."""
    raw = base64.b32decode(public + "=" * (-len(public) % 8))
    if len(raw) != 35 or nkeys.crc16(raw[:-2]) != int.from_bytes(raw[-2:], "little"):
        raise ValueError("not a public nkey")
    return VerifyKey(raw[1:-2])


def user_jwt(
    seed: bytes,
    user_nkey: str,
    name: str,
    publish: list[str],
    subscribe: list[str],
    expires: int | None = None,
) -> str:
    """A user JWT for the global account: ``name`` with exactly these subject allow lists, until ``expires``
    (Unix seconds; nats-server closes the connection then), or for as long as the connection lasts."""
    claims: dict[str, Any] = {
        "sub": user_nkey,
        "aud": GLOBAL_ACCOUNT,
        "name": name,
        "nats": {
            "pub": {"allow": publish},
            "sub": {"allow": subscribe},
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": 2,
        },
    }
    if expires is not None:
        claims["exp"] = expires
    return encode(claims, seed)


def authorization_response(seed: bytes, request: dict[str, Any], *, jwt: str = "", error: str = "") -> str:
    """The callout's answer to one request: a user JWT, or an error (the connection is refused with it)."""
    nats = request["nats"]
    claims = {
        "sub": nats["user_nkey"],
        "aud": nats["server_id"]["id"],
        "nats": {"jwt": jwt, "error": error, "type": "authorization_response", "version": 2},
    }
    return encode(claims, seed)
