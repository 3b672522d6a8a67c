"""The gateway's ``history`` verb on the in-memory log: which entries a job's, a node's and a user's history
hold, who may read which, and that the auditor role reads everything and writes nothing."""

from __future__ import annotations

import msgspec
import pytest

from corral.libs.runtime.errors import Forbidden, InvalidInput, NotFound
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev
from tests.unit.builders import job
from tests.unit.rigs import ADMIN, AUDITOR, Rig


async def bodies(rig: Rig, caller: str, **named: object) -> list[ev.Event]:
    """The bodies of the history the caller reads (raises if refused)."""
    reply = await rig.gateway.history.history(caller, api.HistoryRequest(**named))  # type: ignore[arg-type]
    return [e.envelope.body for e in reply.entries]


def allocated(job_id: int, *nodes: str) -> ev.JobAllocated:
    allocations = [ev.NodeAllocation(node=ev.NodeName(n)) for n in nodes]
    return ev.JobAllocated(
        job_id=ev.JobId(job_id), attempt=0, partition="gpu", allocations=allocations, time_limit_s=None
    )


def exited(job_id: int, node: str) -> ev.RunExited:
    return ev.RunExited(job_id=ev.JobId(job_id), attempt=0, node=ev.NodeName(node), exit_code=0)


async def test_a_jobs_history_is_its_entries_and_its_steps_in_log_order() -> None:
    rig = Rig()
    job_id = await rig.submit("alice", "t1")
    other = await rig.submit("alice", "t2")
    await rig.log.append(allocated(job_id, "gpu01"))
    await rig.log.append(allocated(other, "gpu02"))
    step = ev.StepStarted(
        job_id=ev.JobId(job_id), attempt=0, step_id=0, node=ev.NodeName("gpu01"), name="s", nodes=[], ntasks=1
    )
    await rig.log.append(step)
    await rig.log.append(exited(job_id, "gpu01"))
    got = await bodies(rig, "alice", job_id=job_id)
    assert [type(b).__name__ for b in got] == ["JobSubmitted", "JobAllocated", "StepStarted", "RunExited"]
    assert all(getattr(b, "job_id", None) == job_id for b in got)


async def test_an_array_tasks_history_has_its_arrays_submission_and_whole_array_cancels() -> None:
    rig = Rig()
    spec = job(nodes=1, gpus=1, array=parse_array("0-3"))
    reply = await rig.gateway.submit("alice", api.SubmitRequest(token="a", spec=spec))
    assert isinstance(reply, api.SubmitReply)
    first = reply.job_id
    task = first + 2
    await rig.log.append(allocated(first, "gpu01"))  # the first task's own: not the other task's
    await rig.log.append(allocated(task, "gpu02"))
    await rig.gateway.cancel("alice", api.CancelRequest(job_ids=[first]))  # the whole array
    got = await bodies(rig, "alice", job_id=task)
    assert [type(b).__name__ for b in got] == ["JobSubmitted", "JobAllocated", "JobCancelRequested"]
    assert got[1] == allocated(task, "gpu02")


async def test_a_nodes_history_is_its_events_and_the_jobs_that_name_it() -> None:
    rig = Rig()
    job_id = await rig.submit("alice", "t1")
    other = await rig.submit("bob", "t2")
    await rig.log.append(ev.NodeDown(node=ev.NodeName("gpu01"), reason="Not responding"))
    await rig.log.append(ev.NodeDown(node=ev.NodeName("gpu02"), reason="Not responding"))
    await rig.log.append(allocated(job_id, "gpu02", "gpu01"))
    await rig.log.append(allocated(other, "gpu02"))
    await rig.log.append(exited(job_id, "gpu01"))
    await rig.log.append(exited(job_id, "gpu02"))
    got = await bodies(rig, AUDITOR, node="gpu01")
    assert got == [
        ev.NodeDown(node=ev.NodeName("gpu01"), reason="Not responding"),
        allocated(job_id, "gpu02", "gpu01"),
        exited(job_id, "gpu01"),
    ]


async def test_a_users_history_is_every_entry_of_their_jobs() -> None:
    rig = Rig()
    mine = await rig.submit("alice", "t1")
    theirs = await rig.submit("bob", "t2")
    await rig.log.append(allocated(theirs, "gpu01"))
    await rig.log.append(allocated(mine, "gpu02"))
    got = await bodies(rig, "alice", user="alice")
    assert [(type(b).__name__, getattr(b, "job_id", None)) for b in got] == [
        ("JobSubmitted", mine),
        ("JobAllocated", mine),
    ]


async def test_the_newest_entries_within_the_limit_are_kept_and_the_reply_says_so() -> None:
    rig = Rig()
    job_id = await rig.submit("alice", "t1")
    for node in ("gpu01", "gpu02", "gpu01"):
        await rig.log.append(exited(job_id, node))
    reply = await rig.gateway.history.history("alice", api.HistoryRequest(job_id=job_id, limit=2))
    assert [e.envelope.body for e in reply.entries] == [exited(job_id, "gpu02"), exited(job_id, "gpu01")]
    assert reply.truncated and reply.entries[0].seq < reply.entries[1].seq
    whole = await rig.gateway.history.history("alice", api.HistoryRequest(job_id=job_id))
    assert not whole.truncated and len(whole.entries) == 4


async def test_a_users_history_decodes_only_the_newest_entries_within_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig()
    mine = [await rig.submit("alice", f"a{k}") for k in range(3)]
    theirs = await rig.submit("bob", "b")
    for job_id in (*mine, theirs, mine[0]):
        await rig.log.append(allocated(job_id, "gpu01"))
    decoded: list[str] = []
    real = rig.log.entries

    def counting(filters, wanted=None, slim=False):  # type: ignore[no-untyped-def]
        def seen(subject: str) -> bool:
            ok = wanted is None or wanted(subject)
            if ok:
                decoded.append(subject)
            return ok

        return real(filters, seen, slim)

    monkeypatch.setattr(rig.log, "entries", counting)
    reply = await rig.gateway.history.history("alice", api.HistoryRequest(user="alice", limit=2))
    assert [(type(e.envelope.body).__name__, e.envelope.body.job_id) for e in reply.entries] == [
        ("JobAllocated", mine[2]),
        ("JobAllocated", mine[0]),
    ]
    assert reply.truncated
    # The submissions (to learn whose jobs they are), then only the two newest of alice's seven entries.
    assert [s for s in decoded if not s.endswith("job_submitted")] == [
        f"corral.evt.job.{mine[2]}.job_allocated",
        f"corral.evt.job.{mine[0]}.job_allocated",
    ]
    whole = await rig.gateway.history.history("alice", api.HistoryRequest(user="alice", limit=7))
    assert len(whole.entries) == 7 and not whole.truncated


@pytest.mark.parametrize(
    ("caller", "named", "refusal"),
    [
        ("bob", {"job_id": "alice's"}, "job {job} belongs to alice, not bob: a user may read only their own"),
        ("bob", {"user": "alice"}, "the jobs of alice are not bob's"),
        ("alice", {"node": "gpu01"}, "only the auditor and admin roles may read it"),
    ],
    ids=["another-users-job", "another-users-history", "a-nodes-history"],
)
async def test_a_user_reading_what_is_not_theirs_is_refused_naming_the_rule(
    caller: str, named: dict[str, object], refusal: str
) -> None:
    rig = Rig()
    job_id = await rig.submit("alice", "t1")
    await rig.log.append(allocated(job_id, "gpu01"))
    request = {k: job_id if v == "alice's" else v for k, v in named.items()}
    with pytest.raises(Forbidden, match=refusal.format(job=job_id)):
        await bodies(rig, caller, **request)
    for reader in (ADMIN, AUDITOR):
        assert await bodies(rig, reader, **request)


@pytest.mark.parametrize(
    ("named", "field"),
    [({}, "job_id"), ({"job_id": 1, "node": "gpu01"}, "job_id"), ({"job_id": 1, "limit": 0}, "limit"),
     ({"node": "bad.name"}, "node"), ({"user": "a b"}, "user"),
     ({"user": "alice", "array_task": 1}, "array_task"), ({"job_id": 1, "array_task": -1}, "array_task")],
    ids=["none", "two", "limit", "bad-node", "bad-user", "task-without-array", "negative-task"],
)  # fmt: skip
async def test_a_malformed_history_request_names_its_field(named: dict[str, object], field: str) -> None:
    rig = Rig()
    await rig.submit("alice", "t1")
    with pytest.raises(InvalidInput) as error:
        await bodies(rig, ADMIN, **named)
    assert error.value.field == field


async def test_a_job_that_does_not_exist_is_not_found() -> None:
    with pytest.raises(NotFound, match="no job 7"):
        await bodies(Rig(), ADMIN, job_id=7)


async def test_an_array_task_named_a_t_is_the_task_with_that_index() -> None:
    rig = Rig()
    spec = job(nodes=1, gpus=1, array=parse_array("3,5,9"))
    reply = await rig.gateway.submit("alice", api.SubmitRequest(token="a", spec=spec))
    assert isinstance(reply, api.SubmitReply)
    first = reply.job_id
    await rig.log.append(allocated(first + 1, "gpu01"))  # index 5 is the second task
    await rig.log.append(allocated(first + 2, "gpu02"))
    got = await rig.gateway.history.history("alice", api.HistoryRequest(job_id=first, array_task=5))
    assert got.job_id == first + 1
    assert [e.envelope.body for e in got.entries][1:] == [allocated(first + 1, "gpu01")]
    by_own_id = await rig.gateway.history.history("alice", api.HistoryRequest(job_id=first + 1))
    assert by_own_id.entries == got.entries and by_own_id.job_id == first + 1


@pytest.mark.parametrize("index", [4, 10], ids=["between-indices", "past-the-last"])
async def test_an_array_task_that_does_not_exist_is_not_found_by_its_a_t(index: int) -> None:
    rig = Rig()
    spec = job(nodes=1, gpus=1, array=parse_array("3,5,9"))
    reply = await rig.gateway.submit("alice", api.SubmitRequest(token="a", spec=spec))
    assert isinstance(reply, api.SubmitReply)
    with pytest.raises(NotFound, match=f"no job {reply.job_id}_{index}$"):
        await bodies(rig, "alice", job_id=reply.job_id, array_task=index)


async def test_a_t_of_a_job_that_is_not_an_array_is_not_found() -> None:
    rig = Rig()
    job_id = await rig.submit("alice", "t1")
    with pytest.raises(NotFound, match=f"no job {job_id}_0"):
        await bodies(rig, "alice", job_id=job_id, array_task=0)


async def test_the_auditor_reads_every_history_and_may_call_no_verb_that_writes() -> None:
    rig = Rig()
    job_id = await rig.submit("alice", "t1")
    handlers = rig.gateway.handlers()
    reply = await handlers["history"][1](AUDITOR, api.HistoryRequest(job_id=job_id))
    assert len(reply.entries) == 1
    with pytest.raises(Forbidden, match="has the auditor role, which is read-only: it may not cancel"):
        await handlers["cancel"][1](AUDITOR, api.CancelRequest(job_ids=[job_id]))
    for verb, (_kind, handler) in handlers.items():
        if verb != "history":
            with pytest.raises(Forbidden, match="read-only"):
                await handler(AUDITOR, None)
    assert rig.appended(job_id)[1:] == []
    # The owner and the admin still may.
    await handlers["cancel"][1](ADMIN, api.CancelRequest(job_ids=[job_id]))
    assert rig.appended(job_id)[1:] == [ev.JobCancelRequested(job_id=ev.JobId(job_id), user=ADMIN)]


async def test_the_causes_outside_a_jobs_history_come_with_it_without_scripts() -> None:
    rig = Rig()
    victim = await rig.submit("alice", "t1")
    preemptor = await rig.submit("bob", "t2", script="#!/bin/sh\necho secret\n")
    allocation = await rig.log.append(allocated(victim, "gpu01"))
    request = await rig.log.append(ev.NodeDownRequested(node=ev.NodeName("gpu01"), user=ADMIN, reason="x"))
    down = ev.NodeDown(node=ev.NodeName("gpu01"), reason="x", by=ADMIN)
    downed = await rig.log.append(down, causation_id=request.envelope.meta.event_id)
    await rig.log.append(ev.NodeDown(node=ev.NodeName("gpu02"), reason="Not responding"))
    submission = rig.log.bodies(f"corral.evt.job.{preemptor}.>")[0]
    assert isinstance(submission, ev.JobSubmitted)
    preemption = ev.JobPreempted(
        job_id=ev.JobId(victim), attempt=0, mode="requeue", by_job=ev.JobId(preemptor)
    )
    bob_submitted = await rig.log.last_entry(f"corral.evt.job.{preemptor}.job_submitted")
    assert bob_submitted is not None and bob_submitted.envelope is not None
    await rig.log.append(preemption, causation_id=bob_submitted.envelope.meta.event_id)
    requeued = ev.JobRequeued(job_id=ev.JobId(victim), attempt=0, reason="NodeFail")
    await rig.log.append(requeued, causation_id=downed.envelope.meta.event_id)
    reply = await rig.gateway.history.history("alice", api.HistoryRequest(job_id=victim))
    assert [e.envelope.body for e in reply.entries][-3:] == [allocation.envelope.body, preemption, requeued]
    bob_spec = msgspec.structs.replace(submission.spec, script="", environment={})
    assert [e.envelope.body for e in reply.causes] == [
        msgspec.structs.replace(submission, spec=bob_spec),
        request.envelope.body,
        down,
    ]
