"""The fast rebuild gives the state of the entry-by-entry one (a real nats-server, the scheduler's role).

The old path read the log through ``Bus.read`` (nats-py, one message at a time), decoded every entry in full
and folded it. The new one reads it in bulk (``log_reader.BulkReader``), decodes submissions without their
script and environment (``schemas/slim.py``) and restarts from snapshots of format 5. On a log with every
event type the fold handles, and entries that are no event at all, both give the same state, byte for byte;
the bad entries are still dead-lettered, once; a submission whose environment alone is malformed is folded
alike live and on a rebuild, and its launch fails instead of blocking the other orders.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest

from corral.libs.config.cluster import parse_config
from corral.libs.config.policy import scheduler_state
from corral.libs.core.fold import HANDLERS, IGNORED, apply, skip
from corral.libs.core.state import State, encode_state
from corral.libs.infra import NatsServer, roles
from corral.libs.runtime import log_entries, log_reader
from corral.libs.runtime.bus import Bus, LogEntry
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.log_reader import BulkReader
from corral.libs.runtime.streams import connect, declare
from corral.schemas import codec, subjects
from corral.schemas import events as ev
from corral.services.scheduler import snapshot
from corral.services.scheduler.app import Scheduler
from corral.services.scheduler.replay import replay

pytestmark = pytest.mark.integration

PASSWORDS = {roles.ADMIN: "admin-secret", roles.SCHEDULER: "scheduler-secret"}
CONFIG = parse_config("""
[[nodes]]
names = "rb[1-3]"
cpus = 16
memory = "64G"
gpus = 4

[[partitions]]
name = "batch"
nodes = "rb[1-3]"
default = true
""")
ENV = {"HOME": "/home/alice", "PATH": "/usr/bin:/bin", "CUDA_HOME": "/usr/local/cuda"}


def spec(**fields: object) -> ev.JobSpec:
    base: dict[str, object] = {
        "name": "train",
        "script": "#!/bin/bash\nsrun python train.py --lr 3e-4\n",
        "workdir": "/home/alice/run",
        "environment": ENV,
        "gpus_per_node": 1,
        "time_limit_s": 3600,
        "partition": "batch",
    }
    return ev.JobSpec(**(base | fields))  # type: ignore[arg-type]


def alloc(job_id: int, node: str, gpus: list[int], attempt: int = 0, epoch: int = 1) -> ev.JobAllocated:
    allocation = ev.NodeAllocation(node=node, gpus=gpus, cpus=2, mem_mb=1024)
    return ev.JobAllocated(
        job_id=job_id,
        attempt=attempt,
        partition="batch",
        allocations=[allocation],
        time_limit_s=3600,
        epoch=epoch,
    )


def history() -> list[ev.Event]:
    """Nodes, jobs and reservations through every event type the fold handles (and those it ignores)."""
    array = ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=3)], throttle=2)
    events: list[ev.Event] = [
        *(
            ev.NodeRegistered(node=f"rb{i}", cpus=16, mem_mb=65536, gpus=4, partitions=["batch"])
            for i in (1, 2, 3)
        ),
        ev.NodeHealthReported(node="rb3", source="dcgm", severity="ok"),
        ev.JobSubmitted(job_id=1, user="alice", spec=spec()),
        alloc(1, "rb1", [0]),
        ev.RunStarted(job_id=1, attempt=0, node="rb1", pid=100),
        ev.StepStarted(job_id=1, attempt=0, step_id=0, node="rb1", name="python", nodes=["rb1"], ntasks=1),
        ev.StepExited(job_id=1, attempt=0, step_id=0, node="rb1", exit_code=0),
        ev.JobSignalRequested(job_id=1, user="alice", signal=10, request_id="sig-1"),
        ev.RunExited(job_id=1, attempt=0, node="rb1", exit_code=0),
        ev.JobCompleted(job_id=1, attempt=0, epoch=1),
        ev.JobSubmitted(job_id=2, user="bob", spec=spec(name="sweep", array=array)),  # tasks 2-5
        alloc(2, "rb2", [0]),
        ev.JobCancelRequested(job_id=2, user="bob", whole_array=True),
        ev.JobCancelled(job_id=3, attempt=-1, by="bob", epoch=1),
        ev.JobSubmitted(job_id=6, user="carol", spec=spec(held=True)),
        ev.JobReleaseRequested(job_id=6, user="carol"),
        ev.JobReleased(job_id=6, by="carol", epoch=1),
        ev.JobHoldRequested(job_id=6, user="root", admin=True),
        ev.JobHeld(job_id=6, by="root", admin=True, epoch=1),
        ev.JobUpdateRequested(job_id=6, user="root", admin=True, time_limit_s=600, priority=50),
        ev.JobUpdated(job_id=6, by="root", time_limit_s=600, partition="batch", priority=50, epoch=1),
        ev.JobReasonChanged(job_id=6, attempt=0, reason="Priority", epoch=1),
        ev.JobSubmitted(job_id=7, user="dave", spec=spec(environment={})),
        alloc(7, "rb3", [0, 1]),
        ev.RunStarted(job_id=7, attempt=0, node="rb3", pid=200),
        ev.JobRequeueRequested(job_id=7, user="dave"),
        ev.RunExited(job_id=7, attempt=0, node="rb3", exit_code=0, signal=15),
        ev.JobRequeued(job_id=7, attempt=0, reason="Requested", epoch=1),
        alloc(7, "rb3", [2, 3], attempt=1, epoch=2),
        ev.JobPreempted(job_id=7, attempt=1, mode="requeue", grace_s=30.0, by_job=6, epoch=2),
        ev.NodeDrainRequested(node="rb3", user="root", reason="fan"),
        ev.NodeDrained(node="rb3", reason="fan", by="root"),
        ev.NodeDownRequested(node="rb3", user="root", reason="fan"),
        ev.NodeDown(node="rb3", reason="Not responding"),
        ev.JobFailed(job_id=7, attempt=1, reason="NodeFail", epoch=2),
        ev.NodeUp(node="rb3"),
        ev.NodeResumeRequested(node="rb3", user="root"),
        ev.NodeResumed(node="rb3", by="root"),
        ev.ReservationCreateRequested(
            name="maint", user="root", start_time=2e9, end_time=2e9 + 3600, nodes=["rb1"]
        ),
        ev.ReservationCreated(name="maint", start_time=2e9, end_time=2e9 + 3600, nodes=["rb1"], epoch=2),
        ev.ReservationCreateRequested(
            name="bad", user="root", start_time=2e9, end_time=2e9 + 1, nodes=["rb9"]
        ),
        ev.ReservationRejected(name="bad", reason="no such node rb9", epoch=2),
        ev.ReservationDeleteRequested(name="maint", user="root"),
        ev.ReservationDeleted(name="maint", by="root", epoch=2),
        ev.JobAllocated(  # a deposed leader's decision: fenced
            job_id=6, attempt=0, partition="batch", allocations=[], time_limit_s=600, epoch=1
        ),
    ]
    events += [
        ev.JobSubmitted(job_id=job_id, user="erin", spec=spec(name=f"j{job_id}")) for job_id in range(8, 60)
    ]
    return events


async def append_history(admin: Bus) -> None:
    """The history, with entries that are no event between its entries (an admin's raw publishes)."""
    for n, body in enumerate(history()):
        await admin.append(body, occurred_at=1.9e9 + n)
        if n == 5:
            await admin.js.publish(subjects.job_subject(1, "run_started", "rb1"), b"{not json")
        if n == 12:
            misplaced = ev.JobCancelRequested(job_id=5, user="bob")
            await admin.js.publish(
                subjects.job_subject(4, "job_cancel_requested"), msgspec.json.encode(misplaced)
            )


async def entry_by_entry(bus: Bus) -> State:
    """The old path: ``Bus.read`` (nats-py), every entry decoded in full, folded one by one."""
    state = scheduler_state(CONFIG)
    async for entry in bus.read(1):
        if entry.envelope is None:
            skip(state, entry.seq, entry.subject)
        else:
            apply(state, entry.seq, entry.envelope)
    return state


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    users = [roles.service_user(role, password) for role, password in PASSWORDS.items()]
    with NatsServer(Path(tmp_path_factory.mktemp("nats")), users) as nats_server:
        yield nats_server


@pytest.fixture
async def buses(server: NatsServer) -> AsyncIterator[tuple[Bus, Bus]]:
    """Fresh streams; the scheduler's bus and the admin's."""
    opened = []
    for role in (roles.SCHEDULER, roles.ADMIN):
        nc = await connect(Credentials(url=server.url, user=role, password=PASSWORDS[role]), name=f"t-{role}")
        opened.append(Bus(nc, actor=role))
    scheduler, admin = opened
    for stream in (
        subjects.EVENTS_STREAM,
        subjects.WORK_STREAM,
        subjects.DLQ_STREAM,
        f"OBJ_{subjects.SNAPSHOT_BUCKET}",
    ):
        with contextlib.suppress(Exception):
            await admin.js.delete_stream(stream)
    await declare(admin.js)
    yield scheduler, admin
    for bus in opened:
        await bus.nc.close()


async def test_the_bulk_slim_rebuild_gives_the_entry_by_entry_state(buses: tuple[Bus, Bus]) -> None:
    bus, admin = buses
    folded = {type(body) for body in history()}
    assert set(HANDLERS) | set(IGNORED) | {ev.JobSubmitted} <= folded, "the history misses an event type"
    await append_history(admin)
    old = await entry_by_entry(bus)
    assert old.skipped == 2 and len(old.jobs) == 59

    # The bulk reader alone (a small batch: several requests), then the scheduler's whole rebuild.
    state = scheduler_state(CONFIG)
    skipped: list[int] = []

    def undecodable(entry: LogEntry) -> None:
        assert entry.envelope is None
        skip(state, entry.seq, entry.subject)
        skipped.append(entry.seq)

    end = await bus.last_seq()
    count = await replay(BulkReader(bus.nc, batch=16), state, end, undecodable, lambda entry, why: None)
    assert count == end and len(skipped) == 2
    assert encode_state(state) == encode_state(old)
    rebuilt = Scheduler(bus, CONFIG)
    await rebuilt.rebuild(use_snapshot=False)
    assert encode_state(rebuilt.state) == encode_state(old)
    # A bulk read that cannot be done (here: no such stream) leaves the whole log to the ordinary reader.
    again = Scheduler(bus, CONFIG)
    again.bulk = BulkReader(bus.nc, stream="NO_SUCH_STREAM")
    await again.rebuild(use_snapshot=False)
    assert encode_state(again.state) == encode_state(old)
    # The two entries that are no event were dead-lettered, once however often the log is replayed.
    dead = await admin.js.stream_info(subjects.DLQ_STREAM)
    assert dead.state.messages == 2


async def test_a_receive_buffer_smaller_than_one_entry_gives_the_same_state(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await append_history(admin)
    old = await entry_by_entry(bus)
    # Every frame (a submission is ~1 KB) is larger than the buffer, which grows; reading pauses whenever the
    # room left is under READ_MIN and goes on once the bytes consumed are moved over.
    monkeypatch.setattr(log_reader, "BUFFER", 512)
    monkeypatch.setattr(log_reader, "READ_MIN", 256)
    state = scheduler_state(CONFIG)
    end = await bus.last_seq()

    def undecodable(entry: LogEntry) -> None:
        skip(state, entry.seq, entry.subject)

    count = await replay(BulkReader(bus.nc, batch=7), state, end, undecodable, lambda entry, why: None)
    assert count == end
    assert encode_state(state) == encode_state(old)


async def test_a_snapshot_of_several_segments_plus_the_tail_gives_the_full_replay(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await append_history(admin)
    monkeypatch.setattr(snapshot, "SEGMENT_JOBS", 10)
    first = Scheduler(bus, CONFIG)
    await first.rebuild()
    assert first.snapshot_seq == 0  # no snapshot yet
    size = await snapshot.save(bus, first.state)
    assert size > 0
    data = await snapshot.read(bus)
    assert len(list(snapshot._frames(data))) == 1 + 6  # the header, then 59 jobs in segments of 10
    await admin.append(ev.JobSubmitted(job_id=60, user="erin", spec=spec(name="tail")))
    await admin.append(ev.JobCancelRequested(job_id=8, user="erin"))

    restarted = Scheduler(bus, CONFIG)
    await restarted.rebuild()
    assert restarted.snapshot_seq == first.state.last_seq
    assert encode_state(restarted.state) == encode_state(await entry_by_entry(bus))


async def test_an_old_or_half_written_snapshot_leaves_a_usable_start(buses: tuple[Bus, Bus]) -> None:
    bus, admin = buses
    await append_history(admin)
    store = await admin.js.object_store(subjects.SNAPSHOT_BUCKET)
    # A format-3 snapshot (another name, another layout) is never read: a full replay; the first save of
    # this format deletes it.
    await store.put("scheduler-state-v3", b"x\x9c\x03\x00\x00\x00\x00\x01")
    fresh = Scheduler(bus, CONFIG)
    await fresh.rebuild()
    assert fresh.snapshot_seq == 0
    assert encode_state(fresh.state) == encode_state(await entry_by_entry(bus))
    await snapshot.save(bus, fresh.state)
    assert "scheduler-state-v3" not in {info.name for info in await store.list(ignore_deletes=True)}

    # A scheduler killed while writing the next snapshot leaves chunks of it with no meta pointing at
    # them (the object store switches the meta last): the previous snapshot is what a start loads.
    saved = fresh.state.last_seq
    await admin.append(ev.JobCancelRequested(job_id=9, user="erin"))
    await admin.js.publish(f"$O.{subjects.SNAPSHOT_BUCKET}.C.halfwritten", b"\x00\x00\x01\x00 partial frame")
    restarted = Scheduler(bus, CONFIG)
    await restarted.rebuild()
    assert restarted.snapshot_seq == saved
    assert encode_state(restarted.state) == encode_state(await entry_by_entry(bus))


async def test_a_submission_whose_environment_does_not_decode_is_folded_alike_and_fails_at_launch(
    buses: tuple[Bus, Bus],
) -> None:
    bus, admin = buses
    for i in (1, 2, 3):
        await admin.append(
            ev.NodeRegistered(node=f"rb{i}", cpus=16, mem_mb=65536, gpus=4, partitions=["batch"])
        )
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    stop = asyncio.Event()
    follower = asyncio.create_task(live.follow(stop))
    # Only the admin could write it: the gateway validates the environment with the full JobSpec.
    bad = msgspec.json.decode(
        msgspec.json.encode(
            ev.Envelope(
                meta=ev.Meta(event_id="bad-env", occurred_at=1.9e9, actor=roles.ADMIN),
                body=ev.JobSubmitted(job_id=100, user="mallory", spec=spec()),
            )
        )
    )
    bad["body"]["spec"]["environment"] = {"PATH": 7}
    await admin.js.publish(subjects.job_subject(100, "job_submitted"), msgspec.json.encode(bad))
    await admin.append(ev.JobSubmitted(job_id=101, user="alice", spec=spec()))
    try:
        for _ in range(200):
            good, failed = live.state.jobs.get(101), live.state.jobs.get(100)
            if (
                good is not None
                and good.state == "RUNNING"
                and failed is not None
                and failed.state == "FAILED"
            ):
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
    failed = live.state.jobs[100]
    assert (failed.state, failed.end_reason) == ("FAILED", "LaunchFailed")
    assert "does not decode" in failed.end_message
    node = live.state.jobs[101].allocations[0].node
    assert f"101:0:{node}:launch" in live.sent, "the other job's launch order went out"
    assert not any(sent.startswith("100:") and sent.endswith(":launch") for sent in live.sent)
    # A rebuild folds it as the live scheduler did.
    rebuilt = Scheduler(bus, CONFIG)
    await rebuilt.rebuild(use_snapshot=False)
    assert encode_state(rebuilt.state) == encode_state(live.state)


async def test_a_filtered_read_in_bulk_gives_what_nats_py_gives_and_goes_on_through_it_when_it_must(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Bus.entries`` (a history's read) reads in bulk; where the bulk reader stops (a connection over TLS,
    a lost connection), the rest comes through nats-py, each entry once."""
    bus, admin = buses
    await append_history(admin)
    last = await admin.last_seq()
    filters = [subjects.job_events(1), subjects.job_events(2), subjects.node_events("rb1")]

    def view(entries: list[LogEntry]) -> list[tuple[int, str, str | None, bytes]]:
        return [(e.seq, e.subject, e.error, msgspec.json.encode(e.envelope)) for e in entries]

    fetched = [e async for e in log_entries._fetched(bus.js, filters, 1, last, None, codec.decode_envelope)]
    assert len(fetched) > 10 and any(e.envelope is None for e in fetched)  # a bad entry among them
    assert view([e async for e in bus.entries(filters)]) == view(fetched)
    wanted = [e async for e in bus.entries(filters, wanted=lambda subject: ".rb1" in subject)]
    assert view(wanted) == view([e for e in fetched if ".rb1" in e.subject])
    # The bulk reader stops after a few entries: the rest through nats-py, from the next one.
    real = BulkReader.read

    async def stopping(
        self: BulkReader, from_seq: int, to_seq: int
    ) -> AsyncIterator[list[log_reader.RawEntry]]:
        async for batch in real(self, from_seq, to_seq):
            yield batch[:3]
            raise log_reader.BulkReadError("connection lost")

    monkeypatch.setattr(BulkReader, "read", stopping)
    assert view([e async for e in bus.entries(filters)]) == view(fetched)
