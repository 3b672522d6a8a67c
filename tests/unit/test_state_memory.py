"""What a job costs the scheduler's memory: the containers a job has none of are one shared, immutable empty
(``()`` for the lists, ``NO_ENVIRONMENT`` for the environment), not a new ``[]`` or ``{}`` a job.

A pending job has no allocation, exited node or signal, and its slim spec mostly no argument, node list or
exclusion and never an environment: seven empty containers a job (~400 of ~1,850 bytes, and seven of its
objects) when each was its own. The state keeps a million pending jobs (``bench/rebuild.py``), built by the
fold from the log's slim decode or decoded from a snapshot; both must share them, and the fold must write
the shared empty when it empties one (a ``[]`` would also be encoded, where the default is omitted).
"""

from __future__ import annotations

import msgspec
import pytest
from builders import Log, allocated, cluster, env, exited, job, submitted

from corral.libs.core.fold import fold
from corral.libs.core.state import Job, State, decode_state, encode_state
from corral.schemas import api, codec
from corral.schemas import events as ev
from corral.schemas.codec import decode, decode_slim_envelope, encode
from corral.schemas.job_spec import NO_ENVIRONMENT, ArrayRange, ArraySpec
from corral.services.scheduler import snapshot

pytestmark = pytest.mark.unit

#: The job's fields, and its spec's, that each pending job of the tests has empty.
JOB_EMPTIES = ("allocations", "exited_nodes", "signals")
SPEC_EMPTIES = ("argv", "nodelist", "exclude", "environment")


def empties(j: Job) -> list[object]:
    """The job's empty containers, in the order of JOB_EMPTIES then SPEC_EMPTIES."""
    return [getattr(j, f) for f in JOB_EMPTIES] + [getattr(j.spec, f) for f in SPEC_EMPTIES]


def assert_shared(a: Job, b: Job) -> None:
    """Every empty container of two jobs is one object, and empty."""
    for name, x, y in zip(JOB_EMPTIES + SPEC_EMPTIES, empties(a), empties(b), strict=True):
        assert x is y and not x, f"{name}: {x!r} of job {a.job_id} is not {y!r} of job {b.job_id}"


def slim_log() -> State:
    """Two pending jobs folded as the scheduler folds the log: each entry decoded slim from its bytes."""
    entries = [
        env(submitted(1, job(gpus=1)), at=1.0),
        env(submitted(2, job(gpus=2), user="bob"), at=2.0),
    ]
    return fold([(seq, decode_slim_envelope(encode(e))) for seq, e in enumerate(entries, 1)])


def test_pending_jobs_folded_from_the_log_share_their_empty_containers() -> None:
    state = slim_log()
    assert_shared(state.jobs[1], state.jobs[2])
    assert state.jobs[1].spec.environment is NO_ENVIRONMENT


def test_empty_lists_sent_in_a_spec_decode_as_the_shared_empty() -> None:
    # A client may send them (sbatch sent "argv": [], "nodelist": [], "exclude": [] for every job): the
    # gateway's decode and the scheduler's slim decode both give the shared ``()``, so the log omits them.
    one = msgspec.structs.replace(job(gpus=1), argv=[], nodelist=[], exclude=[])  # type: ignore[arg-type]
    two = msgspec.structs.replace(job(gpus=2), argv=[], nodelist=[], exclude=[])  # type: ignore[arg-type]
    request = decode(encode(api.SubmitRequest(token="t", spec=one)), api.SubmitRequest)
    assert b'"argv"' not in encode(request.spec)
    entries = [env(submitted(1, one), at=1.0), env(submitted(2, two), at=2.0)]
    state = fold([(seq, decode_slim_envelope(encode(e))) for seq, e in enumerate(entries, 1)])
    assert_shared(state.jobs[1], state.jobs[2])


def test_pending_jobs_decoded_from_a_snapshot_share_their_empty_containers() -> None:
    state = slim_log()
    snap = snapshot.Snapshot(format=snapshot.FORMAT, event_id="e", state=state)
    data = snapshot.compress(snapshot.encode(snap))
    decoded = snapshot.decode(data).state
    assert_shared(decoded.jobs[1], decoded.jobs[2])
    assert encode_state(decoded) == encode_state(state)


def test_a_run_emptied_by_the_fold_leaves_the_shared_empties() -> None:
    # A run that ended and was requeued: its allocation, exited nodes and signals are emptied again.
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(gpus=8, nodes=2)), submitted(2, job(gpus=8)))
    log.add(allocated(1, {"gpu01": list(range(8)), "gpu02": list(range(8))}, cpus=2, mem_mb=1000))
    log.add(ev.JobSignalRequested(job_id=1, user="alice", signal=10, request_id="r1"))
    log.add(
        exited(1, "gpu01", signal=9, killed=True),
        exited(1, "gpu02", signal=9, killed=True),
        ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"),
    )
    requeued, pending = log.state.jobs[1], log.state.jobs[2]
    assert (requeued.state, requeued.restart_count) == ("PENDING", 1)
    for name in JOB_EMPTIES:
        assert getattr(requeued, name) is getattr(pending, name) == (), name


def test_the_shared_environment_refuses_changes() -> None:
    with pytest.raises(TypeError, match="read-only"):
        NO_ENVIRONMENT["PATH"] = "/bin"  # type: ignore[index]
    with pytest.raises(TypeError, match="read-only"):
        NO_ENVIRONMENT.update(PATH="/bin")  # type: ignore[attr-defined]
    assert not NO_ENVIRONMENT


def round_trip(state: State) -> State:
    """The state through a snapshot: encoded, compressed, decoded."""
    snap = snapshot.Snapshot(format=snapshot.FORMAT, event_id="e", state=state)
    return snapshot.decode(snapshot.compress(snapshot.encode(snap))).state


def traced(body: ev.Event, k: int) -> ev.Envelope:
    """A submission as the gateway appends it: with a trace context of its own (``k``)."""
    parent = f"00-{k:032x}-{k:016x}-01"
    return codec.envelope(body, actor="test", occurred_at=float(k), event_id=f"{k:032x}", traceparent=parent)


def array_log(tasks: int = 5) -> Log:
    """Two job arrays of ``tasks`` tasks (ids 1.. and 101..) and a job between them, each traced."""
    log = Log(*cluster(nodes=1, gpus=8))
    sweep = ArraySpec(ranges=[ArrayRange(start=0, end=tasks - 1)])
    log.append(traced(submitted(1, msgspec.structs.replace(job(gpus=1), array=sweep)), 1))
    log.append(traced(submitted(50, job(gpus=2), user="bob"), 2))
    log.append(traced(submitted(101, msgspec.structs.replace(job(gpus=4), array=sweep), user="carol"), 3))
    return log


def assert_arrays_shared(decoded: State, firsts: tuple[int, ...], tasks: int) -> None:
    """Each array's tasks have one spec, user and trace context (a trace context, not None)."""
    for first in firsts:
        group = [decoded.jobs[first + k] for k in range(tasks)]
        assert group[0].traceparent is not None
        first = group[0]
        for t in group:
            assert t.spec is first.spec and t.user is first.user and t.traceparent is first.traceparent


def test_a_job_arrays_tasks_decoded_from_a_snapshot_share_one_spec_user_and_trace_context() -> None:
    """The fold gives an array's tasks the submission's spec, user and trace context; a snapshot keeps them
    shared (before, each decoded task had copies of its own: ~880 bytes a task more)."""
    log = array_log()
    decoded = round_trip(log.state)
    assert encode_state(decoded) == encode_state(log.state)
    assert_arrays_shared(decoded, (1, 101), 5)
    assert decoded.jobs[1].spec is not decoded.jobs[101].spec  # (each array its own)
    assert decoded.jobs[1].traceparent != decoded.jobs[101].traceparent
    assert decoded.jobs[50].spec.gpus_per_node == 2


def test_an_array_across_segments_stays_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot, "SEGMENT_JOBS", 2)
    log = array_log(7)
    decoded = round_trip(log.state)
    assert encode_state(decoded) == encode_state(log.state)
    assert_arrays_shared(decoded, (1, 101), 7)


def test_tasks_that_share_their_spec_but_not_their_user_or_trace_context_keep_their_own() -> None:
    """Only a task that shares all three with the task before it is stored without them."""
    log = array_log()
    state = log.state
    jobs = state.jobs
    jobs[2] = msgspec.structs.replace(jobs[2], traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    jobs[4] = msgspec.structs.replace(jobs[4], user="dave")
    decoded = round_trip(state)
    assert encode_state(decoded) == encode_state(state)
    assert (decoded.jobs[2].traceparent, decoded.jobs[4].user) == (jobs[2].traceparent, "dave")
    assert decoded.jobs[3].traceparent == jobs[3].traceparent != jobs[2].traceparent


def test_a_task_updated_on_its_own_keeps_its_own_spec_through_a_snapshot() -> None:
    log = array_log()
    log.add(ev.JobUpdated(job_id=3, by="root", time_limit_s=60, partition=None), step=0.0)
    decoded = round_trip(log.state)
    assert encode_state(decoded) == encode_state(log.state)
    assert decoded.jobs[3].spec.time_limit_s == 60 and decoded.jobs[4].spec.time_limit_s != 60
    assert decoded.jobs[2].spec is decoded.jobs[1].spec is not decoded.jobs[3].spec
    # (The task after it shares with the one before it: a copy of the array's spec of its own, then shared.)
    assert decoded.jobs[5].spec is decoded.jobs[4].spec == decoded.jobs[2].spec


@pytest.mark.parametrize("dropped", [1, 50], ids=["array-task", "single-job"])
def test_a_job_stored_without_a_spec_it_cannot_be_given_does_not_decode(dropped: int) -> None:
    """A task stored without its spec whose task before it is missing, or a job outside an array stored
    without one (a snapshot written wrong): refused, and a full replay follows."""
    log = array_log()
    documents = snapshot.encode(snapshot.Snapshot(format=snapshot.FORMAT, event_id="e", state=log.state))
    assert len(documents) == 2  # the header, one segment
    jobs = msgspec.msgpack.decode(documents[1])
    if dropped == 1:  # the array's first task, the one stored with the spec
        jobs = [j for j in jobs if j["job_id"] != 1]
    else:
        next(j for j in jobs if j["job_id"] == 50).pop("spec")
    cut = [documents[0], msgspec.msgpack.encode(jobs)]
    expected = "job 2 is stored without a spec" if dropped == 1 else "job 50 is stored without a spec"
    with pytest.raises(msgspec.DecodeError, match=expected):
        snapshot.decode(snapshot.compress(cut))


def test_a_state_decoded_from_json_without_a_spec_is_refused() -> None:
    data = encode_state(array_log().state)
    whole = msgspec.json.decode(data)
    whole["jobs"]["50"].pop("spec")
    with pytest.raises(msgspec.ValidationError, match="job 50 has no spec"):
        decode_state(msgspec.json.encode(whole))
