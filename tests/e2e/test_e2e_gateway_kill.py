"""A gateway killed while it has submissions in flight loses nothing it acknowledged (real processes).

A cluster of its own with two gateways (one queue group). A client sends batches of jobs with 8 requests in
flight and retries, with the same tokens, every job that got no answer or a retryable error. Meanwhile the
first gateway is frozen (SIGSTOP: the requests it is given pile up), killed (SIGKILL) and started again.
Then:

- every job has an id, no id was given to two jobs, and the log holds exactly one ``JobSubmitted`` per job:
  a job acknowledged before the kill kept its id; one whose publish the dead gateway never saw was
  submitted by the other; one it stored without answering was found again by its token (same id);
- sending every batch again, after the restart, answers the same id for every token.
"""

from __future__ import annotations

import asyncio
import getpass
import signal
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from nats.aio.client import Client

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.infra import roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import decode, encode

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

BATCHES, PER_BATCH, IN_FLIGHT = 80, 25, 8
SPEC = ev.JobSpec(name="held", script="#!/bin/sh\ntrue\n", workdir="/tmp", held=True, time_limit_s=60)


@pytest.fixture(scope="module")
def two_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of our own with a second gateway."""
    cluster = LocalCluster(tmp_path_factory.mktemp("gwkill"), getpass.getuser(), nodes=1, gpus_per_node=1)
    assert ensure_resolvable([n.name for n in cluster.prepare().nodes]) is None
    cluster.start(ready_timeout=90)
    try:
        cluster._spawn("gateway-2", roles.GATEWAY, "corral.services.gateway", [])
        log = cluster.state_dir / "logs" / "gateway-2.log"
        deadline = time.monotonic() + 30
        while not (log.exists() and '"started"' in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield cluster
    finally:
        cluster.stop()


async def send_all(
    nc: Client, user: str, batches: list[list[str]], during: asyncio.Event
) -> tuple[dict[str, int], int]:
    """Submit every job of ``batches`` (its tokens), retrying what has no id, until each has one; ``during``
    is set once a quarter of the batches were answered. The ids, and how many requests got no answer."""
    ids: dict[str, int] = {}
    lost = 0
    queue = list(batches)
    answered = 0
    deadline = time.monotonic() + 120

    async def worker() -> None:
        nonlocal answered, lost
        while queue and time.monotonic() < deadline:
            tokens = queue.pop(0)
            request = api.SubmitBatchRequest(jobs=[api.SubmitRequest(token=t, spec=SPEC) for t in tokens])
            try:
                msg = await nc.request(subjects.api_subject("submit_batch", user), encode(request), timeout=3)
                reply = decode(msg.data, api.SubmitBatchReply | api.ApiError)
            except Exception:  # no answer (its gateway died) or no responders: all of it again
                lost += 1
                queue.append(tokens)
                await asyncio.sleep(0.3)
                continue
            assert not isinstance(reply, api.ApiError) or reply.retryable, reply
            results = reply.results if isinstance(reply, api.SubmitBatchReply) else []
            again = [t for t, r in zip(tokens, results, strict=True) if not isinstance(r, api.SubmitReply)]
            for token, result in zip(tokens, results, strict=True):
                if isinstance(result, api.SubmitReply):
                    assert ids.setdefault(token, result.job_id) == result.job_id  # an id never changes
                else:
                    assert result.retryable, result
            if again or not results:
                queue.append(again or tokens)
            answered += 1
            if answered >= len(batches) // 4:
                during.set()

    await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))
    return ids, lost


async def logged(cluster: LocalCluster) -> Counter[int]:
    """How often each job id was submitted, from the log."""
    nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="check")
    try:
        seen: Counter[int] = Counter()
        async for entry in Bus(nc, "check").read(1, subject="corral.evt.job.*.job_submitted"):
            if entry.envelope is not None and isinstance(entry.envelope.body, ev.JobSubmitted):
                seen[entry.envelope.body.job_id] += 1
        return seen
    finally:
        await nc.drain()


def test_a_gateway_killed_mid_batch_loses_nothing_acknowledged(two_gateways: LocalCluster) -> None:
    cluster = two_gateways
    run = uuid.uuid4().hex
    batches = [[f"{run}-{b}-{i}" for i in range(PER_BATCH)] for b in range(BATCHES)]
    creds = read_credentials(cluster.user_credentials)

    async def scenario() -> tuple[tuple[dict[str, int], int], tuple[dict[str, int], int]]:
        nc = await connect(creds, name="client")
        during = asyncio.Event()
        sending = asyncio.create_task(send_all(nc, creds.user, batches, during))
        await during.wait()
        # Frozen first, so that the requests the queue group gives it pile up unanswered (some of their jobs
        # appended, some not), then killed as a crash would: SIGKILL, with them in flight.
        gateway = cluster.process("gateway").proc
        assert gateway is not None
        gateway.send_signal(signal.SIGSTOP)
        await asyncio.sleep(0.5)
        cluster.kill("gateway")
        await asyncio.sleep(0.5)
        cluster.revive("gateway")
        ids = await sending
        again = await send_all(nc, creds.user, batches, asyncio.Event())
        await nc.drain()
        return ids, again

    (ids, lost), (again, _) = asyncio.run(scenario())
    assert lost > 0  # the killed gateway had requests in flight, and they were sent again
    assert len(ids) == BATCHES * PER_BATCH
    assert len(set(ids.values())) == len(ids)
    assert again == ids
    seen = asyncio.run(logged(cluster))
    assert set(seen) == set(ids.values()) and set(seen.values()) == {1}
