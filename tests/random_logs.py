"""Random event logs (hypothesis) over a tiny cluster, for the lifecycle property tests.

Two nodes with two GPUs each, three job ids, and every event that can touch a job, a node or a step, with
attempts, epochs and nodes drawn from small ranges so that about as many entries apply as are refused
(stale attempts, a node that went down before the allocation, a GPU given twice, a cancelled job's
allocation). Times grow by one second per entry, from ``T0``.
"""

from __future__ import annotations

from hypothesis import strategies as st

from corral.schemas import codec
from corral.schemas import events as ev

T0 = 1_700_000_000.0
NODES = ("n1", "n2")
JOBS = (1, 2, 3)
GPUS = 2


def registered(node: str) -> ev.NodeRegistered:
    """One of the cluster's nodes registering (2 GPUs, 4 CPUs, 1000 MiB)."""
    return ev.NodeRegistered(node=node, cpus=4, mem_mb=1000, gpus=GPUS, partitions=["gpu"])


_job = st.sampled_from(JOBS)
_node = st.sampled_from(NODES)
_attempt = st.integers(min_value=0, max_value=1)
_conclusion_attempt = st.integers(min_value=-1, max_value=1)
#: A decision's leader epoch: mostly the first leader's, sometimes a successor's (the folds fence the older).
_epoch = st.sampled_from([0, 0, 0, 1])


@st.composite
def _submitted(draw: st.DrawFn, job_id: int | None = None) -> ev.JobSubmitted:
    spec = ev.JobSpec(
        name="j", script="#!/bin/sh\n", workdir="/tmp", nodes=draw(st.integers(1, 2)), gpus_per_node=1
    )
    return ev.JobSubmitted(job_id=draw(_job) if job_id is None else job_id, user="alice", spec=spec)


@st.composite
def _allocated(draw: st.DrawFn) -> ev.JobAllocated:
    nodes = draw(st.lists(_node, min_size=1, max_size=2))
    allocations = [
        ev.NodeAllocation(node=n, gpus=draw(st.sampled_from([[0], [1], [0, 1]])), cpus=1, mem_mb=100)
        for n in nodes
    ]
    return ev.JobAllocated(
        job_id=draw(_job),
        attempt=draw(_attempt),
        partition="gpu",
        allocations=allocations,
        time_limit_s=600,
        epoch=draw(_epoch),
    )


_run_exited = st.builds(
    ev.RunExited,
    job_id=_job,
    attempt=_attempt,
    node=_node,
    exit_code=st.sampled_from([0, 1]),
    killed=st.booleans(),
    oom=st.booleans(),
)

_step_started = st.builds(
    ev.StepStarted,
    job_id=_job,
    attempt=_attempt,
    step_id=st.integers(0, 1),
    node=_node,
    name=st.just("step"),
    nodes=st.lists(_node, min_size=1, max_size=2, unique=True),
    ntasks=st.just(1),
)

_step_exited = st.builds(
    ev.StepExited,
    job_id=_job,
    attempt=_attempt,
    step_id=st.integers(0, 1),
    node=_node,
    exit_code=st.sampled_from([0, 2]),
    killed=st.booleans(),
)

#: One random event.
events: st.SearchStrategy[ev.Event] = st.one_of(
    _submitted(),
    _allocated(),
    _allocated(),
    _allocated(),
    st.builds(ev.RunStarted, job_id=_job, attempt=_attempt, node=_node, pid=st.just(1)),
    _run_exited,
    st.builds(ev.JobCompleted, job_id=_job, attempt=_conclusion_attempt, epoch=_epoch),
    st.builds(
        ev.JobFailed,
        job_id=_job,
        attempt=_conclusion_attempt,
        reason=st.sampled_from(["NonZeroExitCode", "NodeFail", "OutOfMemory", "TimeLimit", "Preempted"]),
        exit_code=st.sampled_from([0, 3]),
        epoch=_epoch,
    ),
    st.builds(ev.JobCancelled, job_id=_job, attempt=_conclusion_attempt, by=st.just("alice"), epoch=_epoch),
    st.builds(
        ev.JobRequeued,
        job_id=_job,
        attempt=_attempt,
        reason=st.sampled_from(["NodeFail", "Requested", "Preempted"]),
        hold=st.booleans(),
        epoch=_epoch,
    ),
    st.builds(ev.JobCancelRequested, job_id=_job, user=st.just("alice")),
    st.builds(ev.JobHeld, job_id=_job, by=st.just("alice"), epoch=_epoch),
    st.builds(ev.JobReleased, job_id=_job, by=st.just("alice"), epoch=_epoch),
    st.builds(
        ev.JobUpdated,
        job_id=_job,
        by=st.just("root"),
        time_limit_s=st.sampled_from([60, 120]),
        partition=st.none(),
        epoch=_epoch,
    ),
    st.builds(
        ev.JobPreempted,
        job_id=_job,
        attempt=_attempt,
        mode=st.sampled_from(["requeue", "cancel"]),
        by_job=_job,
        epoch=_epoch,
    ),
    st.builds(
        ev.JobReasonChanged,
        job_id=_job,
        attempt=_attempt,
        reason=st.sampled_from(["Resources", "Priority", "ReqNodeNotAvail"]),
        detail=st.sampled_from(["", "UnavailableNodes:n2"]),
        epoch=_epoch,
    ),
    st.builds(ev.NodeDown, node=_node, reason=st.just("Not responding")),
    st.builds(ev.NodeUp, node=_node),
    _node.map(registered),
    _step_started,
    _step_exited,
)


@st.composite
def logs(draw: st.DrawFn, max_size: int = 40) -> list[tuple[int, ev.Envelope]]:
    """A log (sequence, envelope): the two nodes register and the jobs are submitted, then random events
    follow, one second apart."""
    bodies: list[ev.Event] = [registered(n) for n in NODES]
    bodies += [draw(_submitted(job_id)) for job_id in JOBS]
    bodies += draw(st.lists(events, max_size=max_size))
    return [
        (seq, codec.envelope(body, actor="test", occurred_at=T0 + seq, event_id=f"e{seq}"))
        for seq, body in enumerate(bodies, start=1)
    ]
