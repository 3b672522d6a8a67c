"""The auth callout (nats-server's ``auth_callout``): who a person is, from their ticket.

nats-server hands every login that is not one of the static users (services, agents, the admin: the
``auth_users``) to this service, on ``$SYS.REQ.USER.AUTH`` (``libs/runtime/nats_jwt.py`` has the exchange).
For each request:

1. check the request is the server's (its JWT verifies and is an ``authorization_request``);
2. take the login's user and password: the password is a ticket (``libs/runtime/tickets.py``), which must be
   signed by a live key of the ticket key file, not expired, and issued to that user;
3. refuse a user whose name is in the revocation bucket (``corral credentials revoke``);
4. answer with a user JWT carrying exactly that person's permissions (``roles.person_permissions``: the
   same rule as a static person's), signed by the issuer key; or with the reason, which the client sees as
   an authorization violation and the server logs. A refusal is dead-lettered on ``corral.dlq.auth`` (who,
   from where, why; never the ticket) and counted (``corral_dead_letters_total{service="auth"}``).

Several replicas share the requests (queue group ``corral-auth``); each re-reads the key file when it
changes, so a rotation needs no restart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js.errors import KeyNotFoundError

from corral.libs.infra import roles
from corral.libs.runtime import nats_jwt, telemetry, tickets
from corral.libs.runtime.service import Context
from corral.schemas import subjects

SERVICE = "auth"


class Refused(Exception):
    """A login the callout will not let in: ``reason`` is the metric label, the message what the server
    logs."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Callout:
    """The decision for one authorization request (steps 1 to 4 of the module docstring)."""

    def __init__(
        self,
        keys: Callable[[], tickets.KeyFile],
        seed: bytes,
        revoked: Callable[[str], Awaitable[bool]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keys = keys  # the ticket keys as they are now
        self.seed = seed  # the issuer account key
        self.revoked = revoked  # is this user revoked?
        self.clock = clock

    async def answer(self, request: dict[str, Any]) -> str:
        """A signed user JWT for the login of ``request``; Refused with the reason otherwise."""
        options = request.get("nats", {}).get("connect_opts", {})
        user, ticket = str(options.get("user") or ""), str(options.get("pass") or "")
        if not user or not ticket:
            raise Refused("no_ticket", "log in with a user name and a ticket from corral authd")
        try:
            publish, subscribe = roles.person_permissions(roles.person_name(user))
        except ValueError as exc:
            raise Refused("invalid_user", str(exc)) from None
        try:
            tickets.verify(self.keys(), ticket, user, self.clock())
        except tickets.TicketError as exc:
            raise Refused(exc.reason, exc.detail) from None
        if await self.revoked(user):
            raise Refused("revoked", f"the credentials of {user!r} are revoked")
        return nats_jwt.user_jwt(self.seed, request["nats"]["user_nkey"], user, publish, subscribe)


def server_request(data: bytes) -> dict[str, Any]:
    """The claims of a server's authorization request; Refused if it is not one."""
    try:
        claims = nats_jwt.decode(data.decode())
    except (UnicodeDecodeError, nats_jwt.JwtError) as exc:
        raise Refused("bad_request", str(exc)) from None
    nats = claims.get("nats")
    if (
        not isinstance(nats, dict)
        or nats.get("type") != "authorization_request"
        or claims.get("iss") != nats.get("server_id", {}).get("id")
        or not nats.get("user_nkey")
    ):
        raise Refused("bad_request", "not a nats-server authorization request")
    return claims


async def main(ctx: Context) -> None:
    """Answer authorization requests until stopped."""
    log = telemetry.logger()
    seed = ctx.args.issuer_seed.read_bytes().strip()
    kv = await ctx.nc.jetstream().key_value(subjects.REVOKED_BUCKET)

    async def revoked(user: str) -> bool:
        with contextlib.suppress(KeyNotFoundError):
            entry = await kv.get(user)
            return entry.value is not None and entry.operation is None
        return False

    callout = Callout(tickets.KeyReader(ctx.args.ticket_key).keys, seed, revoked)

    async def handle(msg: Msg) -> None:
        request: dict[str, Any] = {}
        try:
            request = server_request(msg.data)
            token = await callout.answer(request)
            await msg.respond(nats_jwt.authorization_response(seed, request, jwt=token).encode())
        except Exception as exc:  # a login must get an answer, also when the revocation bucket fails
            refused = (
                exc if isinstance(exc, Refused) else Refused("unavailable", f"{type(exc).__name__}: {exc}")
            )
            if request:
                await msg.respond(nats_jwt.authorization_response(seed, request, error=str(refused)).encode())
            await _dead_letter(ctx, request, refused)
            log.warning("login refused", reason=refused.reason, error=str(refused))

    sub = await ctx.nc.subscribe(nats_jwt.AUTH_SUBJECT, queue="corral-auth", cb=handle)
    try:
        await ctx.stop.wait()
    finally:
        await sub.unsubscribe()


class RefusedLogin(msgspec.Struct, frozen=True):
    """A dead letter of a refused login: who, from where, why (never the ticket)."""

    user: str  # the login's user name
    host: str  # the client's address as the server saw it
    server: str  # the server's name
    reason: str  # the refusal's label
    error: str  # its text


async def _dead_letter(ctx: Context, request: dict[str, Any], refused: Refused) -> None:
    nats = request.get("nats", {})
    body = RefusedLogin(
        user=str(nats.get("connect_opts", {}).get("user") or ""),
        host=str(nats.get("client_info", {}).get("host") or ""),
        server=str(nats.get("server_id", {}).get("name") or ""),
        reason=refused.reason,
        error=str(refused),
    )
    with contextlib.suppress(Exception):
        await ctx.nc.jetstream().publish(
            subjects.dlq_subject(SERVICE),
            msgspec.json.encode(body),
            headers={"Corral-Reason": refused.reason},
        )
    if ctx.metrics is not None:
        ctx.metrics.dead_lettered(SERVICE, refused.reason)
