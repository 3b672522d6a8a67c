"""``corral authd``: the local daemon that tells the cluster who a user is, as munged does for Slurm.

It runs as root on every login and compute host (``corral up`` runs one for the local cluster) and listens
on a Unix socket anyone may connect to (mode 0666; ``--socket``, env ``CORRAL_AUTH_SOCKET``, default
``/run/corral/authd.sock``). For each connection it asks the kernel for the caller's uid (``SO_PEERCRED``:
a process cannot lie about it), looks up that uid's user name, and answers one JSON line, a credentials
record and the ticket's expiry: ``{"url": <the cluster>, "user": <name>, "password": <ticket>, "expires"}``
(``libs/runtime/tickets.py``), or ``{"error": ...}``. Nothing the caller sends is read: the ticket can
only be for the caller's own uid.

The ticket key file (``--key``, default ``/etc/corral/ticket.key``) must be root's and 0600: authd refuses
to start otherwise, since anyone who can read it can sign a ticket for anyone. It is read again when it
changes (``corral credentials rotate``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import msgspec

from corral.cli.cmdclient import peer_uid
from corral.libs.infra import roles
from corral.libs.runtime import tickets

#: Where deployments put the socket (the commands look there last).
DEFAULT_SOCKET = "/run/corral/authd.sock"
DEFAULT_KEY = "/etc/corral/ticket.key"


class AuthError(msgspec.Struct, frozen=True):
    """authd's answer when it cannot vouch for the caller."""

    error: str


class Answer(msgspec.Struct, frozen=True):
    """authd's answer: credentials (``libs/runtime/credentials.py``' fields) and the ticket's expiry."""

    url: str  # the cluster's NATS URL(s)
    user: str  # the caller's Unix user name
    password: str  # the ticket
    expires: int  # Unix seconds


def check_key_file(path: str) -> None:
    """Refuse a key file that someone other than its owner (root, when authd runs as root) could read."""
    info = os.stat(path)
    if info.st_mode & 0o077 or info.st_uid != os.geteuid():
        raise PermissionError(
            f"ticket key {path} must be owned by uid {os.geteuid()} with mode 0600 "
            f"(it is uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}): chmod 600 {path}"
        )


class Authd:
    """Serve tickets on ``socket_path`` for the cluster at ``url``."""

    def __init__(self, socket_path: Path, key_path: Path, url: str, ttl_s: int = tickets.TTL_S) -> None:
        self.socket_path = socket_path
        self.url = url
        self.ttl_s = ttl_s
        self.keys = tickets.KeyReader(key_path, check_key_file).keys  # read again after a rotation
        self._sock: socket.socket | None = None

    def answer(self, uid: int) -> bytes:
        """The credentials of ``uid``, or why there are none."""
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            return msgspec.json.encode(AuthError(f"uid {uid} has no user name on this host"))
        try:
            roles.person_name(name)
        except ValueError as exc:
            return msgspec.json.encode(AuthError(str(exc)))
        now = time.time()
        ticket = tickets.issue(self.keys(), name, uid, self.ttl_s, now)
        return msgspec.json.encode(Answer(self.url, name, ticket, int(now) + self.ttl_s))

    def bind(self) -> None:
        """Listen on the socket (a stale one from an earlier run is replaced)."""
        self.keys()  # fail now, not at the first caller, on a missing or readable key
        self.socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        self.socket_path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)  # anyone may ask: the answer is only ever about themselves
        sock.listen(128)
        self._sock = sock

    def serve_forever(self) -> None:
        """Answer connections one at a time (an answer takes microseconds and nothing is read)."""
        assert self._sock is not None
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by stop()
            with conn:
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):  # the caller went away
                    conn.sendall(self.answer(peer_uid(conn)) + b"\n")

    def stop(self) -> None:
        """Stop listening and remove the socket."""
        if self._sock is not None:
            self._sock.close()
            self.socket_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    """``corral authd``: serve until SIGTERM/SIGINT."""
    p = argparse.ArgumentParser(prog="corral authd", description="issue tickets to local users (as munged)")
    p.add_argument("--socket", default=os.environ.get("CORRAL_AUTH_SOCKET") or DEFAULT_SOCKET)
    p.add_argument("--key", default=DEFAULT_KEY, help=f"ticket key file, 0600 (default {DEFAULT_KEY})")
    p.add_argument("--url", required=True, help="the cluster's NATS URL(s), given to users with the ticket")
    p.add_argument(
        "--ttl", type=int, default=tickets.TTL_S, help=f"ticket lifetime, s (default {tickets.TTL_S})"
    )
    args = p.parse_args(argv)
    daemon = Authd(Path(args.socket), Path(args.key), args.url, args.ttl)
    try:
        daemon.bind()
    except (OSError, ValueError) as exc:
        print(f"corral authd: error: {exc}", file=sys.stderr)
        return 2
    stopped = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        stopped.set()
        daemon.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"corral authd: serving {args.socket}", file=sys.stderr, flush=True)
    daemon.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
