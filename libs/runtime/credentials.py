"""Credentials files: how a process finds and authenticates to a cluster.

A credentials file is JSON ``{"url": ..., "user": ..., "password": ...}``, mode 0600. ``corral up``
writes one per role into ``<state>/credentials/``; commands find the local cluster's user file
without flags, or a remote one through ``CORRAL_NATS_URL`` plus ``CORRAL_CREDENTIALS``.
"""

from __future__ import annotations

import os

import msgspec

# Paths are os.PathLike or str, handled with os.path: pathlib (with fnmatch, urllib.parse and ipaddress)
# costs a command ~7 ms to load, a tenth of its start-up.
PathArg = str | os.PathLike[str]


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    """Where the cluster's NATS is and who we are there."""

    url: str  # nats://host:port
    user: str  # NATS user name = the role or the Unix user name
    password: str  # secret


def new_password() -> str:
    """A fresh random secret."""
    import secrets  # here: the commands only read credentials, and secrets costs them ~4 ms (hmac, random)

    return secrets.token_urlsafe(24)


def write_credentials(path: PathArg, creds: Credentials) -> None:
    """Write a credentials file readable only by its owner (created 0600, never world-readable)."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    tmp = os.path.splitext(path)[0] + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(msgspec.json.encode(creds))
    os.replace(tmp, path)


def read_credentials(path: PathArg) -> Credentials:
    """Read a credentials file; ValueError with the path if it is not one."""
    try:
        with open(path, "rb") as fh:
            return msgspec.json.decode(fh.read(), type=Credentials)
    except (OSError, msgspec.DecodeError) as exc:
        raise ValueError(f"cannot read credentials {path}: {exc}") from None
