"""The shared metrics against a real nats-server: appends by event type, dead letters by reason, a durable
consumer's lag, and API requests and errors by verb."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest
from nats.aio.msg import Msg

from corral.libs.infra import roles
from corral.libs.runtime import metrics as metricsmod
from corral.libs.runtime.api_server import serve
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import InvalidInput, NotFound
from corral.libs.runtime.ports import decode_entry
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import decode, encode

pytestmark = pytest.mark.integration

_ids = itertools.count(960_000)  # apart from the other integration files sharing the NATS server


def spec() -> ev.JobSpec:
    return ev.JobSpec(name="t", script="#!/bin/sh\ntrue\n", workdir="/tmp")


async def test_appends_are_counted_by_event_type_and_a_duplicate_is_not(bus: Bus) -> None:
    metrics = metricsmod.Metrics()
    counted = Bus(bus.nc, actor=bus.actor, metrics=metrics)
    job = next(_ids)
    body = ev.JobSubmitted(job_id=job, user="alice", spec=spec())
    await counted.append(body, msg_id=f"metrics:{job}")
    await counted.append(body, msg_id=f"metrics:{job}")  # a retry: deduplicated by the server
    await counted.append(ev.JobCancelRequested(job_id=job, user="alice"))
    value = metrics.registry.get_sample_value
    assert value("corral_log_appends_total", {"event": "job_submitted"}) == 1.0
    assert value("corral_log_appends_total", {"event": "job_cancel_requested"}) == 1.0


async def test_a_skipped_entry_is_counted_once_however_often_it_is_met(bus: Bus) -> None:
    metrics = metricsmod.Metrics()
    counted = Bus(bus.nc, actor=bus.actor, metrics=metrics)
    job = next(_ids)
    appended = await bus.append(ev.JobSubmitted(job_id=job, user="alice", spec=spec()))
    raw = await bus.js.get_msg(subjects.EVENTS_STREAM, seq=appended.seq, direct=True)
    entry = decode_entry(appended.seq, raw.subject or "", raw.data or b"")
    assert await counted.dead_letter_entry("metrics-test", entry, "a fold handler failed: boom")
    assert not await counted.dead_letter_entry("metrics-test", entry, "a fold handler failed: boom")
    value = metrics.registry.get_sample_value
    assert value("corral_dead_letters_total", {"service": "metrics-test", "reason": "skipped_entry"}) == 1.0


async def test_a_durable_consumer_reports_its_lag_and_its_rejected_messages(bus: Bus) -> None:
    metrics = metricsmod.Metrics()
    counted = Bus(bus.nc, actor=bus.actor, metrics=metrics)
    node = f"mnode{next(_ids)}"
    for i in range(3):
        await bus.publish_order(subjects.work_subject(node), b"not an order", f"metrics:{node}:{i}")
    handled: list[Msg] = []

    async def handler(msgs: list[Msg]) -> None:
        handled.extend(msgs)
        raise InvalidInput("malformed order")

    stop = asyncio.Event()
    durable = f"metrics-{node}"
    task = asyncio.create_task(
        counted.consume(
            subjects.WORK_STREAM, durable, subjects.work_subject(node), handler, service=durable, stop=stop
        )
    )
    try:
        value = metrics.registry.get_sample_value
        labels = {"stream": subjects.WORK_STREAM, "consumer": durable}
        async with asyncio.timeout(20):
            while value("corral_dead_letters_total", {"service": durable, "reason": "rejected"}) != 3.0:
                await asyncio.sleep(0.05)
        # Read before the first fetch: all three were waiting.
        assert value("corral_consumer_pending_messages", labels) == 3.0
        assert value("corral_consumer_ack_pending_messages", labels) == 0.0
    finally:
        stop.set()
        await task
        with contextlib.suppress(Exception):
            await bus.js.delete_consumer(subjects.WORK_STREAM, durable)


async def test_api_requests_and_errors_are_counted_by_verb(bus: Bus) -> None:
    metrics = metricsmod.Metrics()

    async def handler(user: str, req: api.JobsRequest) -> api.JobsReply:
        if req.job_ids:
            raise NotFound(f"no job {req.job_ids[0]}")
        return api.JobsReply(jobs=[])

    token = metricsmod.current.set(metrics)
    try:
        sub = await serve(bus.nc, "metrics_test", api.JobsRequest, handler, queue="metrics-test")
    finally:
        metricsmod.current.reset(token)
    try:
        # As the connection's own user: a service answers only on the caller's own inbox.
        subject = subjects.api_subject("metrics_test", roles.ADMIN)
        for body in (api.JobsRequest(), api.JobsRequest(), api.JobsRequest(job_ids=[7])):
            reply = await bus.nc.request(subject, encode(body), timeout=5)
            decode(reply.data, api.JobsReply | api.ApiError)
        await bus.nc.request(subject, b"{not json", timeout=5)
    finally:
        await sub.unsubscribe()
    value = metrics.registry.get_sample_value
    assert value("corral_api_request_duration_seconds_count", {"verb": "metrics_test"}) == 4.0
    assert value("corral_api_errors_total", {"verb": "metrics_test", "code": "not_found"}) == 1.0
    assert value("corral_api_errors_total", {"verb": "metrics_test", "code": "invalid"}) == 1.0
