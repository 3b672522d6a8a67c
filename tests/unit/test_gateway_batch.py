"""The gateway's ``submit_batch`` on the in-memory ports: each job accepted or refused on its own.

A batch's result has one entry per job, in order: the job's id, or the ``ApiError`` that ``submit`` would
have replied for it (nothing appended for it). The others are appended whatever their neighbours did; a
job's token deduplicates as in ``submit``; ``test_only`` is refused in a batch; an auditor may not send one.
"""

from __future__ import annotations

import dataclasses

import pytest

from corral.libs.runtime.errors import Forbidden
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev
from corral.schemas.codec import decode, encode
from corral.services.gateway.submission import NO_TEST_ONLY
from tests.unit.builders import job
from tests.unit.rigs import AUDITOR, Rig

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def entry(token: str, **spec: object) -> api.SubmitRequest:
    """One job of a batch: a one-node, one-GPU job with ``spec`` overriding the builder's fields."""
    fields: dict[str, object] = {"nodes": 1, "gpus": 1, **spec}
    return api.SubmitRequest(token=token, spec=job(**fields))  # type: ignore[arg-type]


async def batch(
    rig: Rig, *jobs: api.SubmitRequest, user: str = "alice"
) -> list[api.SubmitReply | api.ApiError]:
    """The results of one submit_batch request."""
    reply = await rig.gateway.submit_batch(user, api.SubmitBatchRequest(jobs=list(jobs)))
    assert len(reply.results) == len(jobs)
    return reply.results


async def test_bad_entries_get_their_own_error_and_the_good_ones_are_appended() -> None:
    rig = Rig()
    results = await batch(
        rig,
        entry("a"),
        entry("b", partition="nope"),
        entry("c", gpus=9),
        api.SubmitRequest(token="d", spec=job(nodes=1, gpus=1), test_only=True),
        entry("e"),
    )
    good = [r for r in results if isinstance(r, api.SubmitReply)]
    assert [isinstance(r, api.SubmitReply) for r in results] == [True, False, False, False, True]
    bad = [r for r in results if isinstance(r, api.ApiError)]
    assert [(e.field, e.code) for e in bad] == [
        ("partition", "invalid"),
        ("gpus_per_node", "invalid"),
        ("test_only", "invalid"),
    ]
    assert bad[2].error == NO_TEST_ONLY
    assert len({r.job_id for r in good}) == 2
    submitted = rig.log.bodies("corral.evt.job.*.job_submitted")
    assert sorted(b.job_id for b in submitted if isinstance(b, ev.JobSubmitted)) == sorted(
        r.job_id for r in good
    )


async def test_a_batch_sent_again_is_the_same_jobs_and_a_known_token_its_old_job() -> None:
    rig = Rig()
    single = await rig.submit(token="solo")
    first = await batch(rig, entry("x"), entry("y"))
    again = await batch(rig, entry("x"), entry("y"), entry("solo"), entry("z"))
    assert again[:2] == first
    assert again[2] == api.SubmitReply(job_id=single)
    earlier = {single, *(r.job_id for r in first if isinstance(r, api.SubmitReply))}
    assert isinstance(again[3], api.SubmitReply) and again[3].job_id not in earlier
    assert len(rig.log.bodies("corral.evt.job.*.job_submitted")) == 4


async def test_arrays_in_a_batch_get_their_own_blocks_of_ids() -> None:
    rig = Rig()
    results = await batch(rig, entry("one"), entry("arr", array=parse_array("0-3")), entry("two"))
    ids = [r.job_id for r in results if isinstance(r, api.SubmitReply)]
    assert ids == [ids[0], ids[0] + 1, ids[0] + 5]


async def test_each_job_is_its_callers_and_a_service_account_names_its_user_per_job() -> None:
    rig = Rig()
    results = await batch(
        rig, entry("mine"), api.SubmitRequest(token="other", spec=job(nodes=1, gpus=1), on_behalf_of="bob")
    )
    assert isinstance(results[0], api.SubmitReply)
    assert isinstance(results[1], api.ApiError) and results[1].code == "forbidden"
    [submitted] = rig.log.bodies("corral.evt.job.*.job_submitted")
    assert isinstance(submitted, ev.JobSubmitted) and submitted.user == "alice"


async def test_an_auditor_may_not_send_a_batch() -> None:
    rig = Rig()
    _, handler = rig.gateway.handlers()["submit_batch"]
    with pytest.raises(Forbidden):
        await handler(AUDITOR, api.SubmitBatchRequest(jobs=[entry("a")]))
    assert rig.log.bodies() == []


async def test_max_submit_jobs_counts_the_batchs_own_earlier_jobs() -> None:
    rig = Rig()
    config = rig.gateway.config
    # The only QOS, normal, allows 3 pending or running jobs per user; alice has none yet.
    limited = tuple(dataclasses.replace(q, max_submit_jobs_per_user=3) for q in config.qos)
    rig.gateway.submissions.config = dataclasses.replace(config, qos=limited)

    async def no_live_jobs(user: str, data: bytes) -> bytes:
        return encode(api.LiveCountsReply(counts=[]))

    rig.scheduler.serve("live_counts", no_live_jobs)
    results = await batch(rig, *(entry(f"t{i}") for i in range(5)))
    assert [isinstance(r, api.SubmitReply) for r in results] == [True, True, True, False, False]
    assert all(isinstance(r, api.ApiError) and r.field == "qos" for r in results[3:])


async def test_max_submit_jobs_asks_the_scheduler_for_the_users_count_once_a_batch() -> None:
    # The gateway asked for every live job of the user (squeue's ``jobs`` verb, in pages: thousands of
    # JobInfos at each submission of a user with thousands of jobs); it asks for their count now.
    rig = Rig()
    config = rig.gateway.config
    limited = tuple(dataclasses.replace(q, max_submit_jobs_per_user=5) for q in config.qos)
    rig.gateway.submissions.config = dataclasses.replace(config, qos=limited)
    asked = []

    async def counts(user: str, data: bytes) -> bytes:
        asked.append(decode(data, api.LiveCountsRequest))
        live = [
            api.LiveCount(qos="normal", account="alice", jobs=3),
            api.LiveCount(qos="x", account="a", jobs=9),
        ]
        return encode(api.LiveCountsReply(counts=[*live, api.LiveCount(qos="normal", account="ml", jobs=1)]))

    rig.scheduler.serve("live_counts", counts)
    results = await batch(rig, *(entry(f"p{i}") for i in range(3)))
    assert asked == [api.LiveCountsRequest(user="alice")]
    assert [isinstance(r, api.SubmitReply) for r in results] == [True, False, False]
