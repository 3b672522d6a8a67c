"""Services on the in-memory ports (``MemLog``, ``MemApi``, ``FakeClock``), for their unit tests.

- ``Rig``: a gateway, and the log, clock and scheduler API it runs on;
- ``running``: health services' loops on a log and a clock, started and asleep, stopped on exit;
- ``step`` / ``drive``: move the fake clock and wait (bounded, in real time) for the loops to do their part.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from corral.libs.runtime.clock import FakeClock
from corral.libs.runtime.memapi import MemApi
from corral.libs.runtime.memlog import MemLog
from corral.libs.runtime.service import run_until_stopped
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.gateway.app import Gateway
from corral.services.health.app import Health
from tests.unit.builders import cluster_config, job

#: The cluster's admin in these tests.
ADMIN = "root"
#: The cluster's auditor (read-only) in these tests.
AUDITOR = "auditor"
#: The loops of one health service that sleep on the clock (answer_requests and monitor; follow waits on
#: the log).
HEALTH_SLEEPERS = 2
T = TypeVar("T")


@dataclass
class Rig:
    """A gateway and the fakes it runs on: what it appended is in ``log``."""

    log: MemLog = field(default_factory=lambda: MemLog(actor="gateway"))  # the log and the id counter
    clock: FakeClock = field(default_factory=FakeClock)  # time, moved by the test
    scheduler: MemApi = field(default_factory=lambda: MemApi("gateway"))  # no verb served unless a test does

    def __post_init__(self) -> None:
        self.gateway = Gateway(
            self.log,
            self.log,
            self.scheduler,
            cluster_config(nodes=2),
            self.clock,
            admins=frozenset({ADMIN}),
            auditors=frozenset({AUDITOR}),
        )

    async def submit(self, user: str = "alice", token: str = "t1", **spec: object) -> int:
        """Submit a one-node job (fields of the builders' ``job`` overridden by ``spec``); its id."""
        reply = await self.gateway.submit(
            user, api.SubmitRequest(token=token, spec=job(nodes=1, gpus=1, **spec))
        )
        assert isinstance(reply, api.SubmitReply)
        return reply.job_id

    def appended(self, job_id: int) -> list[ev.Event | None]:
        """The bodies on the job's subjects, in log order."""
        return self.log.bodies(f"corral.evt.job.{job_id}.>")


@contextlib.asynccontextmanager
async def running(log: MemLog, clock: FakeClock, replicas: int = 1) -> AsyncIterator[list[Health]]:
    """``replicas`` health services on ``log``, their loops started and asleep; stopped on exit."""
    stop = asyncio.Event()
    healths = [Health(log, cluster_config(nodes=2), clock) for _ in range(replicas)]
    tasks = [
        asyncio.create_task(run_until_stopped(stop, h.follow(stop), h.answer_requests(stop), h.monitor(stop)))
        for h in healths
    ]
    await clock.asleep(HEALTH_SLEEPERS * replicas)
    try:
        yield healths
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def step(clock: FakeClock, seconds: float, sleepers: int) -> None:
    """Advance the clock; return once ``sleepers`` loops have done what they do then and sleep again."""
    clock.advance(seconds)
    await clock.asleep(sleepers)


async def drive(clock: FakeClock, call: Awaitable[T], sleepers: int, tick: float = 0.05) -> tuple[T, float]:
    """Run ``call`` to its end, advancing the clock by ``tick`` whenever it and the ``sleepers`` loops
    beside it all sleep; its result and the clock time it took. Raises what ``call`` raises."""
    start = clock.monotonic()
    task = asyncio.ensure_future(call)
    while not task.done():
        asleep = asyncio.ensure_future(clock.asleep(sleepers + 1))
        await asyncio.wait({task, asleep}, return_when=asyncio.FIRST_COMPLETED)
        asleep.cancel()
        if not task.done():
            clock.advance(tick)
    return task.result(), clock.monotonic() - start
