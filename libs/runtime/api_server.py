"""Serving API verbs over NATS request/reply: decode, authorise by subject, handle, reply.

The caller is the last token of the request subject (``corral.api.v1.<verb>.<user>``); the NATS
server only lets a user publish on their own token, so that is the authenticated identity. A
handler returns the reply Struct or raises a CorralError, which becomes an ``ApiError`` reply; a
malformed request is answered with an error naming the field and never reaches the handler.

A request's ``traceparent`` header (W3C trace context, sent by a caller that is inside a trace, e.g.
``TRACEPARENT`` in the environment of ``sbatch``) is the parent of the spans the handler starts, so the
gateway's submit span continues the caller's trace; without one the handler starts a new trace.

A request is answered only on a reply subject under the caller's own inbox (``subjects.own_inbox``): the
requester chooses the reply subject and the service publishes its answer there with the service's rights,
so a reply aimed elsewhere (``$KV.corral_ids.job_id``, ``corral.evt.job.<id>.job_allocated``,
``corral.hb.<node>``) would make the service write where the requester may not. Such a request gets no
answer, is dead-lettered (``corral.dlq.<service>``, the reason in ``Corral-Reason``) and counted
(``FOREIGN_REPLY``); the roles no longer have ``allow_responses`` either (``libs/infra/roles.py``).

Each request's time and, for an ``ApiError`` reply, its code are recorded in the process's metrics
(``metrics.current``), when it has any.

A verb served with ``concurrency`` N > 1 handles up to N requests at once, each in a task of its own (the
gateway's: a submission spends most of its time waiting for JetStream, and the others go on meanwhile); the
N+1th waits in the subscription's queue until one ends. With 1 (the default) requests are handled one at a
time, in order, as nats-py delivers them.

``serve`` returns once the server has the verb's subscription (a flush after it), so a request sent from
another connection right after finds it; a connection that is away at that moment returns at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from corral.libs.runtime import metrics as metricsmod
from corral.libs.runtime import nats_link, telemetry
from corral.libs.runtime.errors import CorralError, Forbidden, InvalidInput, NotFound, TransientError
from corral.libs.runtime.telemetry import logger
from corral.schemas import api, subjects
from corral.schemas.api import ApiError
from corral.schemas.codec import DecodeError, decode, encode

Req = TypeVar("Req")

_CODES: list[tuple[type[CorralError], str]] = [
    (InvalidInput, "invalid"),
    (Forbidden, "forbidden"),
    (NotFound, "not_found"),
    (TransientError, "unavailable"),
]


def error_reply(exc: CorralError) -> ApiError:
    """The ApiError a CorralError becomes."""
    code = next((c for cls, c in _CODES if isinstance(exc, cls)), "invalid")
    return ApiError(error=str(exc), field=getattr(exc, "field", None), code=code, retryable=exc.retryable)


#: The ``queue`` of a verb every subscriber answers (no queue group): the caller takes the first answer.
EVERY_SUBSCRIBER = ""
#: Seconds such a subscriber holds back an answer that says it could not answer (an internal or retryable
#: error), so that another's real answer comes first; a deterministic refusal (bad input) goes at once.
ERROR_GRACE_S = 1.0
#: Answers being held back, and requests being handled concurrently (kept referenced until done).
_held: set[asyncio.Task[None]] = set()


#: Seconds ``serve`` waits for the server to confirm a verb's subscription.
SUBSCRIBED_S = 2


async def serve(
    nc: Client,
    verb: str,
    request_type: type[Req],
    handler: Callable[[str, Req], Awaitable[Any]],
    *,
    queue: str,
    concurrency: int = 1,
) -> Subscription:
    """Answer ``verb`` requests from any user with ``handler(user, request)``, as one of the queue group
    ``queue`` (each request to one of its members), or with ``EVERY_SUBSCRIBER`` along with all others;
    up to ``concurrency`` requests at once."""
    log = logger(verb=verb)
    metrics = metricsmod.current.get()

    async def on_request(msg: Msg) -> None:
        if not msg.reply:
            return
        _, user = subjects.api_caller(msg.subject)
        if not subjects.own_inbox(user, msg.reply):
            await refuse_reply(nc, api.VERBS.get(verb, verb), msg, user, metrics)
            return
        started = time.perf_counter()
        try:
            request = decode(msg.data, request_type)
            with telemetry.attached((msg.headers or {}).get("traceparent")):
                reply: Any = await handler(user, request)
        except DecodeError as exc:
            reply = ApiError(error=f"malformed {verb} request: {exc}", field=_field_of(str(exc)))
        except CorralError as exc:
            reply = error_reply(exc)
        except Exception:
            log.exception("request failed")
            reply = ApiError(error=f"internal error handling {verb}; see the service log", code="internal")
        failed = isinstance(reply, ApiError) and (reply.code == "internal" or reply.retryable)
        if failed and queue == EVERY_SUBSCRIBER:
            task = asyncio.create_task(_respond_later(msg, encode(reply)))
            _held.add(task)
            task.add_done_callback(_held.discard)
        else:
            await msg.respond(encode(reply))
        if metrics is not None:
            code = reply.code if isinstance(reply, ApiError) else None
            metrics.served(verb, time.perf_counter() - started, code)

    if concurrency <= 1:
        return await _subscribed(nc, subjects.api_subject(verb, "*"), queue, on_request)
    slots = asyncio.Semaphore(concurrency)

    async def handle(msg: Msg) -> None:
        try:
            await on_request(msg)
        except Exception:  # nats-py would have logged a callback's error; a task's would be lost
            log.exception("request failed")
        finally:
            slots.release()

    async def dispatch(msg: Msg) -> None:
        # Waiting for a slot holds the subscription's delivery back: the requests beyond ``concurrency`` queue
        # in nats-py's pending messages, not in tasks.
        await slots.acquire()
        task = asyncio.create_task(handle(msg))
        _held.add(task)
        task.add_done_callback(_held.discard)

    return await _subscribed(nc, subjects.api_subject(verb, "*"), queue, dispatch)


async def _subscribed(
    nc: Client, subject: str, queue: str, cb: Callable[[Msg], Awaitable[None]]
) -> Subscription:
    """Subscribe, and return once the server has the subscription (a PING answered after the SUB), so that
    a service ready after serving its verbs is heard by the next request from any connection. A connection
    that is away returns at once: nats-py sends its subscriptions again when it is back."""
    sub = await nc.subscribe(subject, queue=queue, cb=cb)
    if nc.is_connected:
        await nats_link.flush(nc, SUBSCRIBED_S)  # lost meanwhile, or slow: the same as away
    return sub


async def _respond_later(msg: Msg, data: bytes) -> None:
    await asyncio.sleep(ERROR_GRACE_S)
    with contextlib.suppress(Exception):  # the connection may be gone by then: the caller retries
        await msg.respond(data)


async def refuse_reply(
    nc: Client, service: str, msg: Msg, caller: str, metrics: metricsmod.Metrics | None = None
) -> None:
    """Dead-letter a request whose reply subject is not under ``caller``'s own inbox, unanswered.

    Its message id names the request (subject, reply, body), so the replicas of a service that all
    received it (``EVERY_SUBSCRIBER``), or a requester sending it again, add one copy within the dead
    letters' duplicate window."""
    reason = f"reply subject {msg.reply!r} is not under the caller's inbox {subjects.inbox_prefix(caller)}"
    digest = hashlib.sha256(b"\0".join([msg.subject.encode(), msg.reply.encode(), msg.data])).hexdigest()
    headers = {
        "Corral-Reason": reason[:500],
        "Corral-Subject": msg.subject,
        "Corral-Reply": msg.reply[:500],
        "Nats-Msg-Id": f"{service}:reply:{digest}",
    }
    logger(subject=msg.subject).warning("request with a foreign reply subject refused", reply=msg.reply)
    with contextlib.suppress(Exception):
        await nc.publish(subjects.dlq_subject(service), msg.data, headers=headers)
    if metrics is not None:
        metrics.dead_lettered(service, metricsmod.FOREIGN_REPLY)


def _field_of(message: str) -> str | None:
    """The JSON path msgspec names in a decode error (``... - at `$.spec.nodes```)."""
    marker = "at `$."
    if marker in message:
        return message.split(marker, 1)[1].split("`", 1)[0]
    return None
