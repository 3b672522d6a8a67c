"""Tickets: who a connection is, vouched for by ``corral authd`` the way munge vouches for a Slurm user.

A ticket is ``corral1.<key id>.<claims>.<mac>``: ``claims`` is base64url JSON ``{"user", "uid", "exp",
"nonce"}`` and ``mac`` the base64url HMAC-SHA256 of ``corral1.<key id>.<claims>`` under the key ``key id``
of the cluster's ticket key file. ``authd`` (root, on every login and compute host) issues one to whoever
connects to its socket, for the uid the kernel reports (``SO_PEERCRED``); the auth callout
(``services/auth``) checks it when that user connects to NATS with it as the password.

The key file (mode 0600, root's: only authd and the callout read it, like ``munge.key``) is JSON
``{"keys": [{"id", "secret", "retire_at"}]}``, the newest key first. ``rotate`` puts a new key first and
gives the others a ``retire_at``: tickets they signed verify until then (a grace for tickets in flight), and
the next rotation drops them. Errors: ``TicketError`` with a short ``reason`` (a metric label and the text
the refused client reads).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable

import msgspec

VERSION = "corral1"
#: Seconds a ticket is good for (munge's default TTL).
TTL_S = 300
#: Seconds a rotated-out key still verifies the tickets it signed.
GRACE_S = 300


class TicketError(ValueError):
    """A ticket that does not prove who it claims: ``reason`` is one of malformed, bad_signature,
    expired, wrong_user."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Claims(msgspec.Struct, frozen=True):
    """What a ticket says."""

    user: str  # the Unix user name of uid on the host that issued it
    uid: int  # the caller's uid, from SO_PEERCRED
    exp: int  # Unix seconds after which it proves nothing
    nonce: str  # random: no two tickets are the same


class Key(msgspec.Struct, frozen=True):
    """One ticket key."""

    id: str  # names the key in the tickets it signs
    secret: str  # base64url, 32 random bytes
    retire_at: int | None = None  # Unix seconds after which it no longer verifies (a rotated-out key)


class KeyFile(msgspec.Struct, frozen=True):
    """The cluster's ticket keys, the newest (the signing one) first."""

    keys: list[Key]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _new_key() -> Key:
    return Key(id=secrets.token_hex(4), secret=_b64(secrets.token_bytes(32)))


def write_keys(path: str | os.PathLike[str], keys: KeyFile) -> None:
    """Write the key file, created 0600 (replaced atomically: a reader sees the old or the new one)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(msgspec.json.encode(keys))
    os.replace(tmp, path)


def ensure_keys(path: str | os.PathLike[str]) -> KeyFile:
    """The key file, created with one fresh key if it does not exist."""
    if not os.path.exists(path):
        write_keys(path, KeyFile(keys=[_new_key()]))
    return read_keys(path)


def read_keys(path: str | os.PathLike[str]) -> KeyFile:
    """Read the key file; ValueError naming it if it is not one."""
    try:
        with open(path, "rb") as fh:
            keys = msgspec.json.decode(fh.read(), type=KeyFile)
    except (OSError, msgspec.DecodeError) as exc:
        raise ValueError(f"cannot read ticket keys {path}: {exc}") from None
    if not keys.keys:
        raise ValueError(f"ticket key file {path} holds no key")
    return keys


def rotate(path: str | os.PathLike[str], grace_s: int = GRACE_S, now: float | None = None) -> KeyFile:
    """A new signing key; the current one verifies for ``grace_s`` more seconds, older retired ones go."""
    now = time.time() if now is None else now
    old = read_keys(path)
    kept = [
        Key(k.id, k.secret, retire_at=int(now) + grace_s if k.retire_at is None else k.retire_at)
        for k in old.keys
        if k.retire_at is None or k.retire_at > now
    ]
    keys = KeyFile(keys=[_new_key(), *kept])
    write_keys(path, keys)
    return keys


class KeyReader:
    """The key file as it is now: read again when it changed (a rotation), else the copy in memory."""

    def __init__(self, path: str | os.PathLike[str], check: Callable[[str], None] | None = None) -> None:
        self.path = os.fspath(path)
        self.check = check  # called with the path before each read (authd: owner and mode)
        self._keys: KeyFile | None = None
        self._stamp: tuple[int, int] = (0, 0)

    def keys(self) -> KeyFile:
        """The current keys; ValueError or OSError if the file is gone or unreadable."""
        info = os.stat(self.path)
        if self._keys is None or (info.st_mtime_ns, info.st_ino) != self._stamp:
            if self.check is not None:
                self.check(self.path)
            self._keys = read_keys(self.path)
            self._stamp = (info.st_mtime_ns, info.st_ino)
        return self._keys


def _mac(key: Key, signed: str) -> str:
    return _b64(hmac.new(_unb64(key.secret), signed.encode(), hashlib.sha256).digest())


def issue(keys: KeyFile, user: str, uid: int, ttl_s: int = TTL_S, now: float | None = None) -> str:
    """A ticket for ``user`` (uid ``uid``), signed with the newest key, good for ``ttl_s`` seconds."""
    now = time.time() if now is None else now
    key = keys.keys[0]
    claims = Claims(user=user, uid=uid, exp=int(now) + ttl_s, nonce=secrets.token_hex(8))
    signed = f"{VERSION}.{key.id}.{_b64(msgspec.json.encode(claims))}"
    return f"{signed}.{_mac(key, signed)}"


def verify(keys: KeyFile, ticket: str, user: str, now: float | None = None) -> Claims:
    """The claims of a ticket for ``user`` signed by a live key and not expired; TicketError otherwise."""
    now = time.time() if now is None else now
    parts = ticket.split(".")
    if len(parts) != 4 or parts[0] != VERSION:
        raise TicketError("malformed", "not a Corral ticket")
    key = next((k for k in keys.keys if k.id == parts[1]), None)
    signed = ".".join(parts[:3])
    if key is None or (key.retire_at is not None and key.retire_at <= now):
        raise TicketError("bad_signature", "signed by a key the cluster does not hold (rotated?)")
    if not hmac.compare_digest(_mac(key, signed), parts[3]):
        raise TicketError("bad_signature", "the signature does not match")
    try:
        claims = msgspec.json.decode(_unb64(parts[2]), type=Claims)
    except (ValueError, msgspec.DecodeError):
        raise TicketError("malformed", "unreadable claims") from None
    if claims.exp <= now:
        raise TicketError("expired", f"expired {int(now) - claims.exp} s ago")
    if claims.user != user:
        raise TicketError("wrong_user", f"issued to {claims.user!r}, presented as {user!r}")
    return claims


def expiry(ticket: str) -> int:
    """When a ticket expires, read without verifying (a client deciding whether to ask for a new one)."""
    try:
        return msgspec.json.decode(_unb64(ticket.split(".")[2]), type=Claims).exp
    except (IndexError, ValueError, msgspec.DecodeError):
        return 0
