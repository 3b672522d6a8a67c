"""``corral credentials``: revoke, restore and rotate (an admin's tools).

- ``revoke USER``: the auth callout refuses USER's tickets from now on (a key in the ``corral_revoked``
  bucket), and USER's connections are closed on every server (the system account's ``CONNZ`` and ``KICK``):
  a long-lived srun or salloc is cut off at once and cannot come back.
- ``restore USER``: undo a revocation.
- ``rotate``: a new ticket key (tickets of the old one verify for ``--grace`` seconds more) and new
  passwords for every static login of the local cluster: the credentials files are rewritten, then each
  NATS server re-reads its configuration (``$SYS.REQ.SERVER.<id>.RELOAD``), closing the connections of the
  old passwords; the services reconnect with the new ones (``service.py`` re-reads its credentials file).

The local cluster's admin and system credentials are used (``--state-dir``); a deployment names them with
``--admin-credentials`` and ``--system-credentials``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client

from corral.libs.config.settings import default_state_dir
from corral.libs.infra import roles
from corral.libs.runtime.credentials import Credentials, new_password, read_credentials, write_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import subjects

#: Seconds to collect the answers of every server to a system request sent to all of them.
GATHER_S = 1.0
#: Seconds a connection is tried again before the command gives up.
CONNECT_S = 10.0

T = TypeVar("T")


async def _each_server(nc: Client, verb: str, body: dict[str, object]) -> list[dict[str, Any]]:
    """The answers of every server to ``$SYS.REQ.SERVER.PING.<verb>``."""
    inbox = nc.new_inbox()
    answers: list[dict[str, object]] = []
    sub = await nc.subscribe(inbox)
    await nc.publish(f"$SYS.REQ.SERVER.PING.{verb}", json.dumps(body).encode(), reply=inbox)
    deadline = time.monotonic() + GATHER_S
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except nats.errors.TimeoutError:
            break
        answers.append(json.loads(msg.data))
    await sub.unsubscribe()
    return answers


async def connected(creds: Credentials, refused_too: bool = False, budget_s: float = CONNECT_S) -> Client:
    """A connection with ``creds``, tried again for ``budget_s`` seconds when it fails (a server restarting,
    reloading or too busy to finish the handshake: CI saw a connection reset during CONNECT); the last
    error after that. Refused credentials are an error at once, unless ``refused_too`` (a password the
    servers are about to load)."""
    deadline = time.monotonic() + budget_s
    while True:
        try:
            return await connect(creds, name="corral-credentials", allow_reconnect=False)
        except (OSError, nats.errors.Error) as exc:
            refused = "Authorization Violation" in str(exc)
            if (refused and not refused_too) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def kick(system: Credentials, user: str) -> int:
    """Close every connection of ``user`` on every server; how many were closed."""
    nc = await connected(system)
    closed = 0
    try:
        for answer in await _each_server(nc, "CONNZ", {"user": user, "limit": 100000}):
            server = answer["server"]["id"]
            for conn in answer.get("data", {}).get("connections") or []:
                await nc.request(f"$SYS.REQ.SERVER.{server}.KICK", json.dumps({"cid": conn["cid"]}).encode())
                closed += 1
    finally:
        await nc.close()
    return closed


async def reload_servers(old: Credentials, new: Credentials) -> int:
    """Have every server re-read its configuration, asked with the system user's ``old`` password (which the
    reload retires, closing this connection before any answer); how many answer to the ``new`` one."""
    nc = await connected(old)
    try:
        ids = [answer["server"]["id"] for answer in await _each_server(nc, "STATSZ", {})]
        inbox = nc.new_inbox()  # a server ignores a reload request without a reply subject
        for server in ids:
            await nc.publish(f"$SYS.REQ.SERVER.{server}.RELOAD", b"", reply=inbox)
        # The reload may close this connection before the PONG: expected (the new password is checked below).
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            await nc.flush()
    finally:
        with contextlib.suppress(nats.errors.Error):
            await nc.close()
    # Refused until the servers have reloaded; and a connection accepted while a server reloads can be
    # closed by it a moment later (CI saw "connection closed" there): asked again on a new one.
    answers = await on_connection(new, lambda nc: _each_server(nc, "STATSZ", {}), refused_too=True)
    return len(answers)


async def on_connection(
    creds: Credentials,
    ask: Callable[[Client], Awaitable[T]],
    refused_too: bool = False,
    budget_s: float = CONNECT_S,
) -> T:
    """``ask`` on a connection with ``creds`` (``connected``); asked again on a new connection when the
    server closed this one meanwhile, until ``budget_s`` seconds have passed."""
    deadline = time.monotonic() + budget_s
    while True:
        nc = await connected(creds, refused_too, max(0.0, deadline - time.monotonic()))
        try:
            return await ask(nc)
        except nats.errors.ConnectionClosedError:
            if time.monotonic() > deadline:
                raise
        finally:
            with contextlib.suppress(nats.errors.Error):
                await nc.close()
        await asyncio.sleep(0.2)


async def revoke(admin: Credentials, system: Credentials, user: str, undo: bool = False) -> int:
    """Revoke (or restore) ``user``; the number of connections closed."""
    nc = await connected(admin)
    try:
        kv = await nc.jetstream().key_value(subjects.REVOKED_BUCKET)
        if undo:
            await kv.delete(user)
            return 0
        await kv.put(user, msgspec.json.encode({"revoked_at": time.time()}))
    finally:
        await nc.close()
    return await kick(system, user)


def rotate(state_dir: Path, grace_s: int) -> int:
    """Rotate the local cluster's ticket key and static passwords; how many servers reloaded."""
    from corral.cli.local_cluster import LocalCluster
    from corral.cli.local_nats import nats_servers
    from corral.libs.runtime import tickets

    people = sorted(p.stem for p in (state_dir / "credentials").glob("*.json"))
    cluster = LocalCluster(state_dir, people[0], guests=tuple(people[1:]), ha=(state_dir / "nats-1").exists())
    cluster.prepare()
    system = read_credentials(cluster.role_credentials(roles.SYSTEM))  # the old password: reloads with it
    tickets.rotate(cluster.auth.ticket_key, grace_s)
    files = [cluster.credentials_of(p) for p in people]
    files += sorted((state_dir / "credentials" / "roles").glob("*.json"))
    for path in files:
        old = read_credentials(path)
        write_credentials(path, Credentials(url=old.url, user=old.user, password=new_password()))
    for server in nats_servers(state_dir, cluster.nats_users(), cluster.ha, cluster.callout()):
        server.rewrite_config()
    return asyncio.run(reload_servers(system, read_credentials(cluster.role_credentials(roles.SYSTEM))))


def main(argv: list[str]) -> int:
    """``corral credentials ...``."""
    p = argparse.ArgumentParser(prog="corral credentials", description="revoke and rotate credentials")
    p.add_argument("--state-dir", type=Path, default=default_state_dir(), help="the local cluster's state")
    p.add_argument("--admin-credentials", type=Path, help="the admin's credentials file (a deployment's)")
    p.add_argument("--system-credentials", type=Path, help="the system account's credentials file")
    sub = p.add_subparsers(dest="action", required=True)
    for action in ("revoke", "restore"):
        sub.add_parser(action).add_argument("user")
    rot = sub.add_parser("rotate", help="new ticket key and passwords (local cluster)")
    rot.add_argument("--grace", type=int, default=tickets_grace(), help="seconds old tickets still verify")
    args = p.parse_args(argv)
    roles_dir = args.state_dir / "credentials" / "roles"
    try:
        if args.action == "rotate":
            count = rotate(args.state_dir, args.grace)
            print(f"corral credentials: rotated; {count} NATS server(s) reloaded")
            return 0
        user = roles.person_name(args.user)
        admin = read_credentials(args.admin_credentials or roles_dir / f"{roles.ADMIN}.json")
        system = read_credentials(args.system_credentials or roles_dir / f"{roles.SYSTEM}.json")
        closed = asyncio.run(revoke(admin, system, user, undo=args.action == "restore"))
    except (ValueError, OSError, nats.errors.Error) as exc:
        print(f"corral credentials: error: {exc}", file=sys.stderr)
        return 1
    if args.action == "revoke":
        print(f"corral credentials: {user} revoked; {closed} connection(s) closed")
    else:
        print(f"corral credentials: {user} restored")
    return 0


def tickets_grace() -> int:
    """The default grace of a rotated-out ticket key (``tickets.GRACE_S``)."""
    from corral.libs.runtime import tickets

    return tickets.GRACE_S
