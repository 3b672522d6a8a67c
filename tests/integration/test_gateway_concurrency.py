"""Several gateways at once on a real nats-server: concurrent submissions, their ids, their tokens, batches.

Three ``Gateway`` objects, each with a connection and a ``Bus`` of its own (so each has its own id grouping,
its own ids held ahead and its own knowledge of the counter's revision, as three gateway processes would),
serve the API as one queue group with ``CONCURRENCY`` requests at once, as ``services/gateway/app.main``
does. The session's NATS log is shared with other tests: each test looks only at its own jobs (its tokens and
the ids replied).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client

from corral.libs.runtime.api_server import serve
from corral.libs.runtime.bus import Bus, NatsApi
from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import decode, encode
from corral.services.gateway.app import CONCURRENCY, IDS_AHEAD, Gateway
from tests.unit.builders import cluster_config, job

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GATEWAYS = 3
SPEC = job(nodes=1, gpus=1, held=True)


@pytest.fixture
async def gateways(admin_creds: Credentials, bus: Bus) -> AsyncIterator[list[Gateway]]:
    """Three gateways serving the API in one queue group, each on its own connection."""
    conns = [await connect(admin_creds, name=f"gateway-{i}") for i in range(GATEWAYS)]
    served = []
    for nc in conns:
        own = Bus(nc, "gateway")
        own.job_ids.hold_ahead(IDS_AHEAD)
        gateway = Gateway(own, own, NatsApi(nc, "gateway"), cluster_config(nodes=2), SystemClock())
        for verb, (kind, handler) in gateway.handlers().items():
            await serve(nc, verb, kind, handler, queue="gateway", concurrency=CONCURRENCY)
        served.append(gateway)
    yield served
    for nc in conns:
        await nc.drain()


@pytest.fixture
async def alice(admin_creds: Credentials) -> AsyncIterator[Client]:
    """User alice's connection."""
    nc = await connect(Credentials(url=admin_creds.url, user="alice", password="alice-secret"), name="alice")
    yield nc
    await nc.drain()


async def call(nc: Client, verb: str, request: msgspec.Struct) -> object:
    """One API request as alice; its decoded reply."""
    msg = await nc.request(subjects.api_subject(verb, "alice"), encode(request), timeout=30)
    reply: object = decode(msg.data, api.SubmitReply | api.SubmitBatchReply | api.ApiError)
    return reply


async def submitted_ids(bus: Bus, ids: set[int]) -> Counter[int]:
    """How many JobSubmitted entries the log holds for each of ``ids``."""
    seen: Counter[int] = Counter()
    for job_id in ids:
        async for entry in bus.entries([subjects.job_subject(job_id, "job_submitted")]):
            if entry.envelope is not None and isinstance(entry.envelope.body, ev.JobSubmitted):
                seen[job_id] += 1
    return seen


async def test_concurrent_submissions_through_several_gateways_get_unique_ids(
    gateways: list[Gateway], alice: Client, bus: Bus
) -> None:
    run = uuid.uuid4().hex
    singles = [api.SubmitRequest(token=f"{run}-s{i}", spec=SPEC) for i in range(300)]
    batches = [
        api.SubmitBatchRequest(
            jobs=[api.SubmitRequest(token=f"{run}-b{b}-{i}", spec=SPEC) for i in range(50)]
        )
        for b in range(6)
    ]
    replies = await asyncio.gather(
        *(call(alice, "submit", r) for r in singles), *(call(alice, "submit_batch", b) for b in batches)
    )
    ids = [r.job_id for r in replies if isinstance(r, api.SubmitReply)]
    for reply in replies:
        if isinstance(reply, api.SubmitBatchReply):
            ids += [one.job_id for one in reply.results if isinstance(one, api.SubmitReply)]
    assert len(ids) == 600, [r for r in replies if isinstance(r, api.ApiError)][:3]
    assert len(set(ids)) == 600
    assert set((await submitted_ids(bus, set(ids))).values()) == {1}
    # Every gateway took a share (one queue group), and each reserved its ids in shared blocks.
    blocks = [g.events.job_ids.reservations for g in gateways]  # type: ignore[attr-defined]
    assert all(n > 0 for n in blocks) and sum(blocks) < 600


async def test_one_token_sent_to_every_gateway_at_once_is_one_job(gateways: list[Gateway], bus: Bus) -> None:
    run = uuid.uuid4().hex
    for k in range(20):
        request = api.SubmitRequest(token=f"{run}-{k}", spec=SPEC)
        replies = await asyncio.gather(*(g.submit("alice", request) for g in gateways for _ in range(3)))
        assert {r.job_id for r in replies if isinstance(r, api.SubmitReply)} == {replies[0].job_id}
        assert (await submitted_ids(bus, {replies[0].job_id}))[replies[0].job_id] == 1


async def test_a_batch_of_good_and_bad_jobs_appends_the_good_ones_and_names_each_bad_one(
    gateways: list[Gateway], alice: Client, bus: Bus
) -> None:
    run = uuid.uuid4().hex
    good = api.SubmitRequest(token=f"{run}-good", spec=SPEC)
    no_partition = api.SubmitRequest(token=f"{run}-part", spec=job(nodes=1, gpus=1, partition="nope"))
    # A job that does not decode (nodes must be >= 1) is refused alone, naming its field.
    raw = msgspec.json.decode(encode(api.SubmitBatchRequest(jobs=[good, no_partition, good])))
    raw["jobs"].insert(2, {"token": f"{run}-bad", "spec": {**raw["jobs"][0]["spec"], "nodes": 0}})
    raw["jobs"][3]["token"] = f"{run}-last"
    msg = await alice.request(
        subjects.api_subject("submit_batch", "alice"), msgspec.json.encode(raw), timeout=30
    )
    reply = decode(msg.data, api.SubmitBatchReply | api.ApiError)
    assert isinstance(reply, api.SubmitBatchReply)
    first, part, bad, last = reply.results
    assert isinstance(first, api.SubmitReply) and isinstance(last, api.SubmitReply)
    assert isinstance(part, api.ApiError) and part.field == "partition"
    assert isinstance(bad, api.ApiError) and bad.field == "jobs[2].spec.nodes", bad
    assert (await submitted_ids(bus, {first.job_id, last.job_id})) == Counter(
        {first.job_id: 1, last.job_id: 1}
    )
    # The same batch again: the same jobs, nothing appended twice.
    again = await alice.request(
        subjects.api_subject("submit_batch", "alice"), msgspec.json.encode(raw), timeout=30
    )
    assert decode(again.data, api.SubmitBatchReply).results[0] == first


async def test_a_gateway_serves_single_submissions_from_the_ids_it_holds(gateways: list[Gateway]) -> None:
    run = uuid.uuid4().hex[:8]
    own = gateways[0].events
    assert isinstance(own, Bus)
    _, submit = gateways[0].handlers()["submit"]
    before = own.job_ids.reservations
    replies = [await submit("alice", api.SubmitRequest(token=f"{run}-{k}", spec=SPEC)) for k in range(3)]
    ids = [r.job_id for r in replies if isinstance(r, api.SubmitReply)]
    assert ids == list(range(ids[0], ids[0] + 3))
    # at most one compare-and-set of the counter for the three (none if the ids were held already)
    assert own.job_ids.reservations - before <= 1
    assert await own.last_job_id() >= ids[-1]
