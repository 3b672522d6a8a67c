"""The gateway's cancel, hold, release, update and requeue on the in-memory ports.

Each request is checked against the job's submission and its newest entries in the log, and what is
accepted is appended as one intent per job, in the submission's trace; what is refused appends nothing.
"""

from __future__ import annotations

import pytest

from corral.libs.runtime.errors import Forbidden, InvalidInput
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.gateway import control
from tests.unit.builders import allocated, job
from tests.unit.rigs import ADMIN, Rig

# A fake clock nobody advances would hang a test that waits on it: fail it fast instead.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


async def test_cancel_appends_one_intent_in_the_jobs_trace() -> None:
    rig = Rig()
    job_id = await rig.submit()
    reply = await rig.gateway.cancel("alice", api.CancelRequest(job_ids=[job_id, job_id + 7]))
    assert [(o.job_id, o.error) for o in reply.outcomes] == [
        (job_id, None),
        (job_id + 7, control.INVALID_JOB),
    ]
    assert rig.appended(job_id)[1:] == [ev.JobCancelRequested(job_id=ev.JobId(job_id), user="alice")]
    entry = await rig.log.last_entry(f"corral.evt.job.{job_id}.job_cancel_requested")
    assert entry is not None and entry.envelope is not None
    assert entry.envelope.meta.correlation_id == str(job_id)


async def test_only_the_owner_or_an_admin_may_cancel() -> None:
    rig = Rig()
    job_id = await rig.submit()
    with pytest.raises(Forbidden):
        await rig.gateway.cancel("bob", api.CancelRequest(job_ids=[job_id]))
    assert len(rig.appended(job_id)) == 1
    await rig.gateway.cancel(ADMIN, api.CancelRequest(job_ids=[job_id]))
    assert rig.appended(job_id)[1:] == [ev.JobCancelRequested(job_id=ev.JobId(job_id), user=ADMIN)]


async def test_cancelling_an_arrays_id_is_one_entry_for_every_task() -> None:
    rig = Rig()
    reply = await rig.gateway.submit(
        "alice", api.SubmitRequest(token="a", spec=job(nodes=1, gpus=1, array=parse_array("0-3")))
    )
    assert isinstance(reply, api.SubmitReply)
    await rig.gateway.cancel("alice", api.CancelRequest(job_ids=[reply.job_id]))
    assert rig.log.bodies("corral.evt.job.*.job_cancel_requested") == [
        ev.JobCancelRequested(job_id=ev.JobId(reply.job_id), user="alice", whole_array=True)
    ]


#: (case, the job's entries after its submission, hold's outcome)
HOLDS: list[tuple[str, list[ev.Event], str | None]] = [
    ("pending", [], None),
    ("running", [allocated(1, {"gpu01": [0]})], control.NOT_PENDING),
    (
        "completed",
        [allocated(1, {"gpu01": [0]}), ev.JobCompleted(job_id=ev.JobId(1), attempt=0)],
        control.ALREADY_DONE,
    ),
]


@pytest.mark.parametrize(("after", "error"), [c[1:] for c in HOLDS], ids=[c[0] for c in HOLDS])
async def test_only_a_pending_job_is_held(after: list[ev.Event], error: str | None) -> None:
    rig = Rig()
    job_id = await rig.submit()
    assert job_id == 1
    for body in after:
        await rig.log.append(body)
    reply = await rig.gateway.hold("alice", api.HoldRequest(job_ids=[job_id]))
    assert [o.error for o in reply.outcomes] == [error]
    held = [b for b in rig.appended(job_id) if isinstance(b, ev.JobHoldRequested)]
    assert held == ([] if error else [ev.JobHoldRequested(job_id=ev.JobId(job_id), user="alice")])


async def test_a_user_may_not_hold_anothers_job_nor_release_an_admin_hold() -> None:
    rig = Rig()
    job_id = await rig.submit()
    reply = await rig.gateway.hold("bob", api.HoldRequest(job_ids=[job_id]))
    assert [o.error for o in reply.outcomes] == [control.DENIED]
    await rig.gateway.hold(ADMIN, api.HoldRequest(job_ids=[job_id]))
    await rig.log.append(ev.JobHeld(job_id=ev.JobId(job_id), by=ADMIN, admin=True))
    reply = await rig.gateway.release("alice", api.ReleaseRequest(job_ids=[job_id]))
    assert [o.error for o in reply.outcomes] == [control.DENIED]
    reply = await rig.gateway.release(ADMIN, api.ReleaseRequest(job_ids=[job_id]))
    assert [o.error for o in reply.outcomes] == [None]
    intents = [b for b in rig.appended(job_id) if isinstance(b, ev.JobHoldRequested | ev.JobReleaseRequested)]
    assert intents == [
        ev.JobHoldRequested(job_id=ev.JobId(job_id), user=ADMIN, admin=True),
        ev.JobReleaseRequested(job_id=ev.JobId(job_id), user=ADMIN, admin=True),
    ]


#: (case, user, request fields, outcome): the job's limit is its partition's default, 1 hour.
UPDATES: list[tuple[str, str, dict[str, object], str | None]] = [
    ("user-lowers-limit", "alice", {"time_limit_s": 600}, None),
    ("user-raises-limit", "alice", {"time_limit_s": 7200}, control.DENIED),
    ("admin-raises-limit", ADMIN, {"time_limit_s": 7200}, None),
    ("user-sets-priority", "alice", {"priority": 5}, control.DENIED),
    ("admin-sets-priority", ADMIN, {"priority": 5}, None),
    ("another-user", "bob", {"time_limit_s": 600}, control.DENIED),
]


@pytest.mark.parametrize(("user", "fields", "error"), [c[1:] for c in UPDATES], ids=[c[0] for c in UPDATES])
async def test_update_rules(user: str, fields: dict[str, object], error: str | None) -> None:
    rig = Rig()
    job_id = await rig.submit()
    reply = await rig.gateway.update(user, api.UpdateRequest(job_id=job_id, **fields))
    assert [o.error for o in reply.outcomes] == [error]
    updates = [b for b in rig.appended(job_id) if isinstance(b, ev.JobUpdateRequested)]
    expected = ev.JobUpdateRequested(job_id=ev.JobId(job_id), user=user, admin=user == ADMIN, **fields)
    assert updates == ([] if error else [expected])


async def test_an_update_that_changes_nothing_is_refused() -> None:
    rig = Rig()
    job_id = await rig.submit()
    with pytest.raises(InvalidInput, match="nothing to update"):
        await rig.gateway.update("alice", api.UpdateRequest(job_id=job_id))


async def test_requeue_needs_a_live_run_and_a_requeueable_job() -> None:
    rig = Rig()
    pinned = await rig.submit(token="p", requeue=False)
    running = await rig.submit(token="r")
    pending = await rig.submit(token="q")
    await rig.log.append(allocated(running, {"gpu01": [0]}))
    reply = await rig.gateway.requeue("alice", api.RequeueRequest(job_ids=[pinned, running, pending]))
    assert [o.error for o in reply.outcomes] == [control.REQUEUE_DISABLED, None, control.PENDING]
    assert rig.log.bodies("corral.evt.job.*.job_requeue_requested") == [
        ev.JobRequeueRequested(job_id=ev.JobId(running), user="alice", hold=False)
    ]


async def test_a_cancel_naming_a_job_of_another_user_appends_nothing() -> None:
    rig = Rig()
    mine = [await rig.submit(token=f"t{k}") for k in range(3)]
    theirs = await rig.submit(user="bob", token="b")
    with pytest.raises(Forbidden, match=f"job {theirs} belongs to bob"):
        await rig.gateway.cancel("alice", api.CancelRequest(job_ids=[*mine[:2], theirs, mine[2]]))
    assert rig.log.bodies("corral.evt.job.*.job_cancel_requested") == []


async def test_many_jobs_are_cancelled_held_and_released_each_with_its_outcome_in_request_order() -> None:
    rig = Rig()
    ids = [await rig.submit(token=f"t{k}") for k in range(600)]  # more than the gateway's AT_ONCE
    theirs = await rig.submit(user="bob", token="b")
    named = [*ids[:300], theirs, 10_000, *ids[300:]]
    held = await rig.gateway.hold("alice", api.HoldRequest(job_ids=named))
    assert [(o.job_id, o.error) for o in held.outcomes] == [
        (job_id, control.DENIED if job_id == theirs else control.INVALID_JOB if job_id == 10_000 else None)
        for job_id in named
    ]
    assert sorted(b.job_id for b in rig.log.bodies("corral.evt.job.*.job_hold_requested")) == ids
    reply = await rig.gateway.cancel("alice", api.CancelRequest(job_ids=[*ids, 10_000]))
    assert [(o.job_id, o.error) for o in reply.outcomes] == [(i, None) for i in ids] + [
        (10_000, control.INVALID_JOB)
    ]
    assert sorted(b.job_id for b in rig.log.bodies("corral.evt.job.*.job_cancel_requested")) == ids
