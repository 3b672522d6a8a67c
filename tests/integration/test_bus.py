"""The bus against a real nats-server: idempotent appends, optimistic concurrency, ordered replay."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import AppendConflict
from corral.schemas import events as ev
from corral.schemas import subjects

pytestmark = pytest.mark.integration

_ids = itertools.count(900_000)


def spec() -> ev.JobSpec:
    return ev.JobSpec(name="t", script="#!/bin/sh\ntrue\n", workdir="/tmp")


async def test_duplicate_msg_id_is_appended_once(bus: Bus) -> None:
    job = next(_ids)
    body = ev.JobSubmitted(job_id=job, user="alice", spec=spec())
    first = await bus.append(body, msg_id=f"submit:alice:tok-{job}")
    again = await bus.append(body, msg_id=f"submit:alice:tok-{job}")
    assert not first.duplicate
    assert again.duplicate and again.seq == first.seq
    seqs = [e.seq async for e in bus.read(first.seq, subject=subjects.job_events(job))]
    assert seqs == [first.seq]


async def test_stale_expected_subject_sequence_is_rejected(bus: Bus) -> None:
    job = next(_ids)
    submitted = await bus.append(ev.JobSubmitted(job_id=job, user="alice", spec=spec()))
    cancel = await bus.append(
        ev.JobCancelRequested(job_id=job, user="alice"),
        expect_last_seq=submitted.seq,
        expect_subject=subjects.job_events(job),
    )
    # A decision taken on the state as of the submission is now stale: it must lose.
    with pytest.raises(AppendConflict):
        await bus.append(
            ev.JobCancelled(job_id=job, attempt=-1, by="alice"),
            expect_last_seq=submitted.seq,
            expect_subject=subjects.job_events(job),
        )
    ok = await bus.append(
        ev.JobCancelled(job_id=job, attempt=-1, by="alice"),
        expect_last_seq=cancel.seq,
        expect_subject=subjects.job_events(job),
    )
    assert ok.seq > cancel.seq


async def test_replay_is_ordered_and_reports_malformed_entries(bus: Bus) -> None:
    job = next(_ids)
    first = await bus.append(ev.JobSubmitted(job_id=job, user="alice", spec=spec()))
    await bus.js.publish(subjects.job_subject(job, "job_cancel_requested"), b"{not json")
    await bus.append(ev.JobCancelRequested(job_id=job, user="alice"))
    # A body that names another job than its subject is rejected as well.
    other = bus  # same connection, raw publish of a valid envelope on the wrong subject
    from corral.schemas.codec import encode, envelope

    wrong = envelope(ev.JobCancelRequested(job_id=job + 1, user="mallory"), actor="mallory")
    await other.js.publish(subjects.job_subject(job, "job_cancel_requested"), encode(wrong))
    entries = [e async for e in bus.read(first.seq, subject=subjects.job_events(job))]
    assert [e.seq for e in entries] == sorted(e.seq for e in entries)
    assert [e.envelope is not None for e in entries] == [True, False, True, False]
    assert entries[3].error is not None and "belongs on" in entries[3].error


async def test_job_ids_are_monotonic(bus: Bus) -> None:
    ids = [await bus.next_job_id() for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5


async def test_a_block_of_ids_is_reserved_at_once(bus: Bus) -> None:
    before = await bus.next_job_id()
    block = await bus.next_job_id(1001)
    after = await bus.next_job_id()
    assert (block, after) == (before + 1, before + 1002)
    assert await bus.last_job_id() == after
    # Concurrent reservations never overlap.
    firsts = await asyncio.gather(*(bus.next_job_id(10) for _ in range(8)))
    starts = sorted(firsts)
    assert all(a + 10 <= b for a, b in itertools.pairwise(starts))
