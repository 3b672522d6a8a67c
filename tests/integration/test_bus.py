"""The bus against a real nats-server: idempotent appends, optimistic concurrency, ordered replay."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.bus import Bus, LogEntry
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.errors import AppendConflict, TransientError
from corral.libs.runtime.streams import connect
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


async def test_a_log_without_its_stream_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    """A stream with no leader for a moment (a cluster server died) answers nothing: nats-py raises its
    ``NoStreamResponseError``, which every writer must see as the log being away (``TransientError``, so
    it retries), never as a failure that ends the task appending (an agent's exit report was lost so)."""
    users = [roles.service_user(roles.ADMIN, "admin-secret")]
    with NatsServer(tmp_path / "nats", users) as server:  # no stream declared: nobody answers appends
        creds = Credentials(url=server.url, user=roles.ADMIN, password="admin-secret")
        nc = await connect(creds, name="tests-no-stream")
        try:
            lonely = Bus(nc, actor="tests")
            with pytest.raises(TransientError, match="append"):
                await lonely.append(ev.JobCancelRequested(job_id=next(_ids), user="alice"))
            with pytest.raises(TransientError, match="order"):
                await lonely.publish_order(subjects.work_subject("node1"), b"{}", "order-1")
            entry = LogEntry(seq=1, subject="corral.evt.job.1.x", envelope=None, error="bad")
            with pytest.raises(TransientError, match="dead letter"):
                await lonely.dead_letter_entry("tests", entry, "bad")
        finally:
            await nc.close()
