"""Verbs every replica answers (``EVERY_SUBSCRIBER``): the caller takes the first answer, so a replica that
could not answer (an internal or retryable error) holds its error back and another's real answer wins."""

from __future__ import annotations

import asyncio
import time

import pytest

from corral.libs.runtime.api_server import ERROR_GRACE_S, EVERY_SUBSCRIBER, serve
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.errors import InvalidInput, TransientError
from corral.libs.runtime.streams import connect
from corral.schemas import api, subjects
from corral.schemas.codec import decode, encode

pytestmark = pytest.mark.integration

GOOD = api.PingReply(controllers=[api.ControllerInfo(name="standby", role="backup", up=True)])


async def ask(creds: Credentials, verb: str) -> tuple[api.PingReply | api.ApiError, float]:
    nc = await connect(creds, name="tests-caller")
    try:
        started = time.monotonic()
        msg = await nc.request(subjects.api_subject(verb, creds.user), encode(api.PingRequest()), timeout=5)
        return decode(msg.data, api.PingReply | api.ApiError), time.monotonic() - started
    finally:
        await nc.close()


@pytest.mark.parametrize("failure", [RuntimeError("bug"), TransientError("the bucket is away")])
async def test_a_replica_that_cannot_answer_does_not_beat_one_that_can(
    admin_creds: Credentials, failure: Exception
) -> None:
    verb = f"ping_{type(failure).__name__.lower()}"

    async def broken(user: str, req: api.PingRequest) -> api.PingReply:
        raise failure

    async def slow(user: str, req: api.PingRequest) -> api.PingReply:
        await asyncio.sleep(0.2)
        return GOOD

    nc = await connect(admin_creds, name="tests-replicas")
    subs = [await serve(nc, verb, api.PingRequest, h, queue=EVERY_SUBSCRIBER) for h in (broken, slow)]
    try:
        reply, took = await ask(admin_creds, verb)
        assert reply == GOOD and took < ERROR_GRACE_S, (reply, took)
    finally:
        for sub in subs:
            await sub.unsubscribe()
        await nc.close()


async def test_a_refusal_goes_at_once_and_a_lone_failure_still_answers(admin_creds: Credentials) -> None:
    async def refuses(user: str, req: api.PingRequest) -> api.PingReply:
        raise InvalidInput("no such thing", field="x")

    async def fails(user: str, req: api.PingRequest) -> api.PingReply:
        raise TransientError("the bucket is away")

    nc = await connect(admin_creds, name="tests-replicas")
    try:
        sub = await serve(nc, "ping_refuses", api.PingRequest, refuses, queue=EVERY_SUBSCRIBER)
        reply, took = await ask(admin_creds, "ping_refuses")
        assert isinstance(reply, api.ApiError) and reply.field == "x" and took < ERROR_GRACE_S
        await sub.unsubscribe()
        sub = await serve(nc, "ping_fails", api.PingRequest, fails, queue=EVERY_SUBSCRIBER)
        reply, took = await ask(admin_creds, "ping_fails")
        assert isinstance(reply, api.ApiError) and reply.retryable and took >= ERROR_GRACE_S
        await sub.unsubscribe()
    finally:
        await nc.close()
