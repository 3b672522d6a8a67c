"""The tracer's NATS role may read the log through its own durable consumer and publish no event."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.streams import declare
from corral.schemas import events as ev
from corral.schemas import subjects

pytestmark = pytest.mark.integration


async def test_the_tracer_reads_the_log_and_may_append_nothing(tmp_path: Path) -> None:
    users = [
        roles.service_user(roles.ADMIN, "admin-secret"),
        roles.service_user(roles.TRACER, "tracer-secret"),
    ]
    errors: asyncio.Queue[Exception] = asyncio.Queue()

    async def on_error(error: Exception) -> None:
        await errors.put(error)

    with NatsServer(tmp_path / "nats", users) as server:
        admin = await nats.connect(server.url, user=roles.ADMIN, password="admin-secret")
        tracer = await nats.connect(
            server.url,
            user=roles.TRACER,
            password="tracer-secret",
            inbox_prefix=subjects.inbox_prefix(roles.TRACER),
            error_cb=on_error,
        )
        try:
            await declare(admin.jetstream())
            await Bus(admin, "corral-gateway").append(ev.NodeUp(node="n1"))
            bus = Bus(tracer, roles.TRACER)
            got: list[int] = []
            stop = asyncio.Event()

            async def handle(msgs: list[Msg]) -> None:
                got.extend(m.metadata.sequence.stream for m in msgs)
                stop.set()

            await asyncio.wait_for(
                bus.consume(
                    subjects.EVENTS_STREAM,
                    "tracer",
                    subjects.EVENTS_SUBJECTS,
                    handle,
                    service="tracer",
                    stop=stop,
                ),
                timeout=15,
            )
            assert got == [1]
            await tracer.publish(subjects.node_subject("n1", "node_down"), b"{}")
            await tracer.flush()
            error = await asyncio.wait_for(errors.get(), timeout=5)
            assert "permissions violation for publish" in str(error).lower()
            assert await bus.last_seq() == 1
        finally:
            await tracer.close()
            await admin.close()
