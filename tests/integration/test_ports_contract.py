"""One contract per port, run against the real adapter and its in-memory fake (``libs/runtime/ports.py``).

The log on a real nats-server (``Bus``) and ``MemLog`` must agree on everything the services rely on:
sequences, idempotent appends, conditional appends over wildcard subjects, newest-entry lookups, ordered
and filtered replay with its pending counts, following, unreadable entries, job id blocks. ``NatsApi`` and
``MemApi`` agree on replies and on a verb nobody serves; ``SystemClock`` and ``FakeClock`` on sleeping.
The NATS log is shared by the session, so each test works on job ids of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest
from nats.aio.msg import Msg

from corral.libs.runtime import last_entries
from corral.libs.runtime.bus import Bus, NatsApi
from corral.libs.runtime.clock import FakeClock, SystemClock
from corral.libs.runtime.errors import AppendConflict
from corral.libs.runtime.memapi import MemApi
from corral.libs.runtime.memlog import MemLog
from corral.libs.runtime.ports import ApiClient, Clock, EventLog, JobIds, LogEntry
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.schemas.codec import encode, envelope

pytestmark = pytest.mark.integration

_ids = itertools.count(950_000)


@dataclass
class Log:
    """One adapter of the log under contract, and how to store raw bytes in it."""

    log: EventLog  # the log
    ids: JobIds  # its job id counter
    put: Callable[[str, bytes], Awaitable[None]]  # a raw publish (malformed entries)


@pytest.fixture(params=["nats", "memory"])
async def log(request: pytest.FixtureRequest, bus: Bus) -> Log:
    """The real log on the session's nats-server, then the in-memory one."""
    if request.param == "nats":

        async def publish(subject: str, data: bytes) -> None:
            await bus.js.publish(subject, data)

        return Log(bus, bus, publish)
    mem = MemLog()

    async def put(subject: str, data: bytes) -> None:
        mem.put(subject, data)

    return Log(mem, mem, put)


def submitted(job: int) -> ev.JobSubmitted:
    return ev.JobSubmitted(
        job_id=ev.JobId(job), user="alice", spec=ev.JobSpec(name="t", script="#!/bin/sh\n", workdir="/")
    )


def cancel(job: int) -> ev.JobCancelRequested:
    return ev.JobCancelRequested(job_id=ev.JobId(job), user="alice")


async def entries(log: EventLog, subject: str, from_seq: int = 1) -> list[LogEntry]:
    return [e async for e in log.read(from_seq, subject=subject)]


async def test_appends_are_read_back_by_sequence_and_by_newest_on_a_subject(log: Log) -> None:
    job = next(_ids)
    first = await log.log.append(submitted(job), correlation_id="c1")
    second = await log.log.append(cancel(job))
    assert second.seq > first.seq and not first.duplicate
    got = await log.log.entry(first.seq)
    assert got.envelope is not None and got.envelope.body == submitted(job)
    assert got.subject == subjects.job_subject(job, "job_submitted")
    assert got.envelope.meta.correlation_id == "c1"
    newest = await log.log.last_entry(subjects.job_events(job))
    assert newest is not None and newest.seq == second.seq
    own = await log.log.last_entry(subjects.job_subject(job, "job_submitted"))
    assert own is not None and own.seq == first.seq
    assert await log.log.last_entry(subjects.job_events(next(_ids))) is None


async def test_the_newest_entries_of_many_subjects_come_at_once(
    log: Log, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What last_entry gives for each subject, in a few requests however many subjects (the gateway's lookups
    # of the jobs of an `scancel -u`): absent subjects are left out, an unreadable entry comes undecoded.
    monkeypatch.setattr(last_entries, "CHUNK", 7)  # several requests on the real log
    jobs = [next(_ids) for _ in range(20)]
    for job in jobs[::2]:
        await log.log.append(submitted(job))
        await log.log.append(cancel(job))
    await log.put(subjects.job_subject(jobs[1], "job_submitted"), b"not json")
    wanted = [
        subjects.job_subject(job, tag) for job in jobs for tag in ("job_submitted", "job_cancel_requested")
    ]
    got = await log.log.last_entries(wanted)
    expected = {s: e for s in wanted if (e := await log.log.last_entry(s)) is not None}
    assert got == expected
    assert len(got) == 10 * 2 + 1
    assert got[subjects.job_subject(jobs[1], "job_submitted")].envelope is None
    body = got[subjects.job_subject(jobs[2], "job_submitted")].envelope
    assert body is not None and body.body == submitted(jobs[2])
    assert await log.log.last_entries([subjects.job_subject(next(_ids), "job_submitted")]) == {}
    assert await log.log.last_entries([]) == {}


async def test_a_star_matches_one_token_and_a_chevron_the_rest(log: Log) -> None:
    job = next(_ids)
    await log.log.append(submitted(job))
    cancelled = await log.log.append(cancel(job))
    started = await log.log.append(
        ev.RunStarted(job_id=ev.JobId(job), attempt=0, node=ev.NodeName("n1"), pid=1)
    )
    one_token = await log.log.last_entry(f"corral.evt.job.{job}.*")
    assert one_token is not None and one_token.seq == cancelled.seq  # run facts have a node token more
    rest = await log.log.last_entry(subjects.job_events(job))
    assert rest is not None and rest.seq == started.seq
    facts = await entries(log.log, f"corral.evt.job.{job}.*.*", cancelled.seq)
    assert [e.seq for e in facts] == [started.seq]


async def test_a_chevron_needs_a_token_to_match(log: Log) -> None:
    job = next(_ids)
    await log.put(f"corral.evt.job.{job}", b"{}")
    assert await log.log.last_entry(subjects.job_events(job)) is None


async def test_a_reader_not_following_ends_with_what_was_there_when_it_started(log: Log) -> None:
    job = next(_ids)
    first = await log.log.append(submitted(job))
    second = await log.log.append(cancel(job))
    seen = []
    async for entry in log.log.read(first.seq, subject=subjects.job_events(job)):
        seen.append(entry.seq)
        if len(seen) == 1:
            await log.log.append(cancel(job))
    assert seen == [first.seq, second.seq]


async def test_a_message_id_appends_once_and_an_expectation_is_checked_first(log: Log) -> None:
    job = next(_ids)
    first = await log.log.append(submitted(job), msg_id=f"submit:alice:{job}")
    again = await log.log.append(submitted(job), msg_id=f"submit:alice:{job}")
    assert (again.seq, again.duplicate) == (first.seq, True)
    await log.log.append(cancel(job))
    # The server checks the expected sequence before the message id: a stale retry is a conflict.
    with pytest.raises(AppendConflict):
        await log.log.append(
            submitted(job),
            msg_id=f"submit:alice:{job}",
            expect_last_seq=first.seq,
            expect_subject=subjects.job_events(job),
        )
    assert len(await entries(log.log, subjects.job_subject(job, "job_submitted"))) == 1


async def test_a_conditional_append_wins_only_on_the_newest_sequence_of_its_wildcard(log: Log) -> None:
    job = next(_ids)
    events = subjects.job_events(job)
    first = await log.log.append(submitted(job), expect_last_seq=0, expect_subject=events)
    with pytest.raises(AppendConflict) as lost:
        await log.log.append(cancel(job), expect_last_seq=0, expect_subject=events)
    assert (lost.value.subject, lost.value.expected) == (events, 0)
    won = await log.log.append(cancel(job), expect_last_seq=first.seq, expect_subject=events)
    with pytest.raises(AppendConflict):
        await log.log.append(cancel(job), expect_last_seq=first.seq, expect_subject=events)
    # Another job's entries never make this job's expectation stale.
    await log.log.append(submitted(next(_ids)))
    after = await log.log.append(cancel(job), expect_last_seq=won.seq, expect_subject=events)
    assert after.seq > won.seq


async def test_without_a_subject_the_expectation_is_on_the_bodys_own_subject(log: Log) -> None:
    job = next(_ids)
    await log.log.append(submitted(job))
    own = await log.log.append(cancel(job), expect_last_seq=0)
    with pytest.raises(AppendConflict) as lost:
        await log.log.append(cancel(job), expect_last_seq=0)
    assert lost.value.subject == subjects.job_subject(job, "job_cancel_requested")
    assert (await log.log.append(cancel(job), expect_last_seq=own.seq)).seq > own.seq


async def test_replay_is_ordered_filtered_counts_what_is_pending_and_flags_bad_entries(log: Log) -> None:
    job, other = next(_ids), next(_ids)
    first = await log.log.append(submitted(job))
    await log.log.append(submitted(other))
    await log.put(subjects.job_subject(job, "job_cancel_requested"), b"{not json")
    wrong = envelope(cancel(job + 1000), actor="mallory")
    await log.put(subjects.job_subject(job, "job_cancel_requested"), encode(wrong))
    last = await log.log.append(cancel(job))
    got = await entries(log.log, subjects.job_events(job), first.seq)
    assert [e.seq for e in got] == sorted(e.seq for e in got) and got[-1].seq == last.seq
    assert [e.envelope is not None for e in got] == [True, False, False, True]
    assert got[1].error and got[2].error and "belongs on" in got[2].error
    assert [e.pending for e in got] == [3, 2, 1, 0]
    later = await entries(log.log, subjects.job_events(job), got[2].seq)
    assert [e.seq for e in later] == [got[2].seq, last.seq]


async def test_a_following_reader_gets_what_is_appended_after_it_started(log: Log) -> None:
    job = next(_ids)
    first = await log.log.append(submitted(job))
    seen: asyncio.Queue[LogEntry] = asyncio.Queue()

    async def follow() -> None:
        async for entry in log.log.read(first.seq, subject=subjects.job_events(job), follow=True):
            await seen.put(entry)

    reader = asyncio.create_task(follow())
    try:
        caught_up = await asyncio.wait_for(seen.get(), 5.0)
        assert (caught_up.seq, caught_up.pending) == (first.seq, 0)
        await log.log.append(submitted(next(_ids)))  # another job's: not on the filter
        later = await log.log.append(cancel(job))
        got = await asyncio.wait_for(seen.get(), 5.0)
        assert (got.seq, got.pending) == (later.seq, 0)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def test_entries_of_several_subjects_come_in_log_order_up_to_the_start(log: Log) -> None:
    job, other, third = next(_ids), next(_ids), next(_ids)
    first = await log.log.append(submitted(job))
    await log.log.append(submitted(other))
    step = ev.StepStarted(
        job_id=ev.JobId(job), attempt=0, step_id=0, node=ev.NodeName("n1"), name="s", nodes=[], ntasks=1
    )
    stepped = await log.log.append(step)
    await log.put(subjects.job_subject(job, "job_cancel_requested"), b"{not json")
    last = await log.log.append(cancel(job))
    filters = [subjects.job_events(job), subjects.step_events(job), subjects.job_events(third)]
    got = [e async for e in log.log.entries(filters)]
    assert [e.seq for e in got] == [first.seq, stepped.seq, last.seq - 1, last.seq]
    assert [e.envelope is not None for e in got] == [True, True, False, True]
    assert [e async for e in log.log.entries([subjects.job_events(third)])] == []
    # What is appended while reading is not read: the reader ends with what was there at its start.
    reader = log.log.entries([subjects.job_events(job)])
    assert (await anext(reader)).seq == first.seq
    await log.log.append(cancel(job))
    assert [e.seq async for e in reader] == [last.seq - 1, last.seq]


async def test_entries_skip_the_subjects_not_wanted_undecoded_and_slim_leaves_scripts_out(log: Log) -> None:
    job, other = next(_ids), next(_ids)
    first = await log.log.append(submitted(job))
    await log.put(subjects.job_subject(other, "job_cancel_requested"), b"{not json")
    await log.log.append(submitted(other))
    last = await log.log.append(cancel(job))
    filters = [subjects.job_events(job), subjects.job_events(other)]
    mine = f".{job}."
    got = [e async for e in log.log.entries(filters, wanted=lambda subject: mine in subject)]
    assert [e.seq for e in got] == [first.seq, last.seq]
    slim = [e async for e in log.log.entries([subjects.job_events(job)], slim=True)]
    full = [e async for e in log.log.entries([subjects.job_events(job)])]
    assert [e.seq for e in slim] == [e.seq for e in full] == [first.seq, last.seq]
    assert slim[0].envelope is not None and full[0].envelope is not None
    lean, whole = slim[0].envelope.body, full[0].envelope.body
    assert isinstance(whole, ev.JobSubmitted) and whole.spec.script != ""
    assert (lean.job_id, lean.user, lean.spec.script) == (job, "alice", "")  # type: ignore[union-attr]
    assert slim[1].envelope is not None and full[1].envelope is not None
    assert slim[1].envelope.body == full[1].envelope.body


async def test_job_ids_come_in_blocks(log: Log) -> None:
    before = await log.ids.next_job_id()
    block = await log.ids.next_job_id(10)
    after = await log.ids.next_job_id()
    assert (block, after) == (before + 1, before + 11)
    assert await log.ids.last_job_id() == after
    with pytest.raises(ValueError, match="at least 1"):
        await log.ids.next_job_id(0)


# --- ApiClient ----------------------------------------------------------------------------------------

_verbs = itertools.count()
#: How a test serves a verb: (verb, handler of (caller, request) -> reply).
Serve = Callable[[str, Callable[[str, bytes], Awaitable[bytes]]], Awaitable[None]]


@pytest.fixture(params=["nats", "memory"])
async def api(request: pytest.FixtureRequest, bus: Bus) -> AsyncIterator[tuple[ApiClient, Serve]]:
    """A client of user ``gw``, and how to serve a verb to it."""
    subs = []
    if request.param == "nats":

        async def serve_nats(verb: str, handler: Callable[[str, bytes], Awaitable[bytes]]) -> None:
            async def on(msg: Msg) -> None:
                await msg.respond(await handler(subjects.api_caller(msg.subject)[1], msg.data))

            subs.append(await bus.nc.subscribe(subjects.api_subject(verb, "*"), cb=on))
            await bus.nc.flush()

        yield NatsApi(bus.nc, "gw"), serve_nats
    else:
        mem = MemApi("gw")

        async def serve_mem(verb: str, handler: Callable[[str, bytes], Awaitable[bytes]]) -> None:
            mem.serve(verb, handler)

        yield mem, serve_mem
    for sub in subs:
        await sub.unsubscribe()


async def test_a_served_verb_answers_and_sees_the_caller(api: tuple[ApiClient, Serve]) -> None:
    client, serve = api
    verb = f"contract{next(_verbs)}"

    async def echo(user: str, data: bytes) -> bytes:
        return user.encode() + b":" + data

    await serve(verb, echo)
    assert await client.request(verb, b"hi", 5.0) == b"gw:hi"


async def test_a_verb_nobody_serves_or_a_slow_one_times_out(api: tuple[ApiClient, Serve]) -> None:
    client, serve = api
    with pytest.raises(TimeoutError):
        await client.request(f"contract{next(_verbs)}", b"", 5.0)
    slow = f"contract{next(_verbs)}"

    async def late(user: str, data: bytes) -> bytes:
        await asyncio.sleep(1.0)
        return b"late"

    await serve(slow, late)
    with pytest.raises(TimeoutError):
        await client.request(slow, b"", 0.1)


# --- Clock --------------------------------------------------------------------------------------------


@pytest.fixture(params=["system", "fake"])
def clock(request: pytest.FixtureRequest) -> tuple[Clock, Callable[[float], Awaitable[None]]]:
    """A clock and how to let ``seconds`` pass on it."""
    if request.param == "system":
        return SystemClock(), asyncio.sleep
    fake = FakeClock()

    async def advance(seconds: float) -> None:
        await fake.asleep()
        fake.advance(seconds)

    return fake, advance


async def test_a_sleep_lasts_its_time_unless_woken(
    clock: tuple[Clock, Callable[[float], Awaitable[None]]],
) -> None:
    c, let_pass = clock
    start, wall = c.monotonic(), c.now()
    sleeper = asyncio.create_task(c.sleep(0.05))
    await let_pass(0.06)
    await asyncio.wait_for(sleeper, 2.0)
    assert c.monotonic() - start >= 0.05 and c.now() - wall >= 0.05
    wake = asyncio.Event()
    woken = asyncio.create_task(c.sleep(3600.0, wake))
    await asyncio.sleep(0)
    wake.set()
    await asyncio.wait_for(woken, 2.0)
    assert c.monotonic() - start < 3600.0
    await asyncio.wait_for(c.sleep(3600.0, wake), 2.0)  # set already: no sleep at all
