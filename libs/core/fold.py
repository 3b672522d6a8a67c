"""The fold of the log into the scheduler's state (``state.py``).

``apply(state, seq, envelope)`` is deterministic: no IO, no clock (times come from the events),
no randomness, so replaying the log rebuilds exactly the live state (``encode_state`` gives the
bytes to compare). The fold is also the guard of the invariants (see ``state.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from corral.libs.core.fair_share import billing, charge, user_key
from corral.libs.core.fold_nodes import NODE_HANDLERS, drop_orphans
from corral.libs.core.reservations import (
    RESERVATION_HANDLERS,
    expire_reservations,
)
from corral.libs.core.state import (
    HoldControl,
    Job,
    Node,
    Orphan,
    PendingSignal,
    Preemption,
    RunExit,
    SpecChange,
    State,
    array_tasks,
    array_throttle,
)
from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.schemas import events as ev


def fold(entries: list[tuple[int, ev.Envelope]], state: State | None = None) -> State:
    """Apply entries (sequence, envelope) in order to ``state`` (a new one if None)."""
    state = state if state is not None else State()
    for seq, env in entries:
        apply(state, seq, env)
    return state


def apply(state: State, seq: int, env: ev.Envelope) -> None:
    """Apply one log entry; entries at or below ``state.last_seq`` were applied already."""
    if seq <= state.last_seq:
        return
    state.last_seq = seq
    state.now = max(state.now, env.meta.occurred_at)
    if state.reservations:
        expire_reservations(state)
    body = env.body
    if isinstance(body, ev.JobSubmitted):
        _submitted(state, seq, env.meta.occurred_at, body, env.meta.traceparent)
        return
    handler = _HANDLERS.get(type(body))
    if handler is not None:
        handler(state, seq, env.meta.occurred_at, body)


def _job_for(state: State, seq: int, job_id: int) -> Job | None:
    job = state.jobs.get(job_id)
    if job is not None:
        job.last_seq = seq
    return job


def _submitted(state: State, seq: int, at: float, body: ev.JobSubmitted, traceparent: str | None) -> None:
    array = body.spec.array
    try:
        indices: list[int | None] = [None] if array is None else list(array_indices(array))
    except FormatError:
        return
    first = body.job_id
    ids = range(first, first + len(indices))
    # All or nothing: an array whose block of ids is not wholly free is not accepted at all.
    if any(job_id in state.jobs for job_id in ids):
        return
    # The state keeps what scheduling needs: the script and the exported environment (most of a
    # submission's bytes) stay in the log, where the shell reads them back to launch (``submit_seq``).
    spec = slim_spec(body.spec)
    for job_id, index in zip(ids, indices, strict=True):
        state.active[job_id] = True
        state.jobs[job_id] = Job(
            job_id=job_id,
            user=body.user,
            spec=spec,
            submit_time=at,
            last_seq=seq if job_id == first else 0,
            traceparent=traceparent,
            held="user" if body.spec.held else "",
            array_job_id=first if index is not None else 0,
            array_task_id=index,
            submit_seq=seq,
        )


def slim_spec(spec: ev.JobSpec) -> ev.JobSpec:
    """A submission's spec as the state keeps it: without the script and the exported environment."""
    if not spec.script and not spec.environment:
        return spec
    return msgspec.structs.replace(spec, script="", environment={})


def _cancel_requested(state: State, seq: int, at: float, body: ev.JobCancelRequested) -> None:
    job = _job_for(state, seq, body.job_id)
    if job is None:
        return
    # The entry is on the first task's subject only: the other tasks' last_seq stays as it is.
    targets = array_tasks(state, job.job_id) if body.whole_array else [job]
    for target in targets:
        if target.state in ("PENDING", "RUNNING") and target.cancel_by is None:
            target.cancel_by = body.user


def _requeue_requested(state: State, seq: int, at: float, body: ev.JobRequeueRequested) -> None:
    job = _job_for(state, seq, body.job_id)
    # Only a live run that is not ending already: a cancelled, preempted or exited run is concluded as it is.
    if job is None or job.state != "RUNNING" or job.run_exit is not None:
        return
    if job.cancel_by is not None or job.preempting is not None or job.requeue_by is not None:
        return
    job.requeue_by, job.requeue_hold = body.user, body.hold


def _signal_requested(state: State, seq: int, at: float, body: ev.JobSignalRequested) -> None:
    job = _job_for(state, seq, body.job_id)
    # A signal is for the run that is live now; one that ended (or a pending job) gets none.
    if job is None or job.state != "RUNNING" or job.run_exit is not None:
        return
    if any(s.request_id == body.request_id for s in job.signals):
        return
    signal = PendingSignal(request_id=body.request_id, signal=body.signal, scope=body.scope)
    job.signals = [*job.signals, signal]


def _control_requested(
    state: State, seq: int, at: float, body: ev.JobHoldRequested | ev.JobReleaseRequested
) -> None:
    job = _job_for(state, seq, body.job_id)
    # Only a pending job can be held or released; a request that finds the job started is moot.
    if job is not None and job.state == "PENDING":
        release = isinstance(body, ev.JobReleaseRequested)
        job.control = HoldControl(release=release, user=body.user, admin=body.admin)


def _held(state: State, seq: int, at: float, body: ev.JobHeld) -> None:
    job = _job_for(state, seq, body.job_id)
    if job is not None and job.state == "PENDING":
        job.held = "admin" if body.admin else "user"
        job.control = None


def _released(state: State, seq: int, at: float, body: ev.JobReleased) -> None:
    job = _job_for(state, seq, body.job_id)
    if job is not None and job.state == "PENDING" and job.held:
        job.held = ""
        job.control = None
        job.priority_override = None


def _update_requested(state: State, seq: int, at: float, body: ev.JobUpdateRequested) -> None:
    job = _job_for(state, seq, body.job_id)
    if job is None or job.state != "PENDING":
        return
    before = job.change or SpecChange(user=body.user)
    job.change = SpecChange(
        user=body.user,
        time_limit_s=body.time_limit_s if body.time_limit_s is not None else before.time_limit_s,
        partition=body.partition if body.partition is not None else before.partition,
        priority=body.priority if body.priority is not None else before.priority,
    )


def _updated(state: State, seq: int, at: float, body: ev.JobUpdated) -> None:
    job = _job_for(state, seq, body.job_id)
    if job is not None and job.state == "PENDING":
        job.spec = msgspec.structs.replace(job.spec, time_limit_s=body.time_limit_s, partition=body.partition)
        job.change = None
        # Slurm: Priority=0 holds the job (JobHeldAdmin); a release gives it its computed priority back.
        if body.priority == 0:
            job.held, job.priority_override = "admin", None
        else:
            job.priority_override = body.priority


def _fits(node: Node, alloc: ev.NodeAllocation) -> bool:
    if not node.up or any(g in node.used_gpus or not 0 <= g < node.gpus for g in alloc.gpus):
        return False
    return node.alloc_cpus + alloc.cpus <= node.cpus and node.alloc_mem_mb + alloc.mem_mb <= node.mem_mb


def _allocated(state: State, seq: int, at: float, body: ev.JobAllocated) -> None:
    job = _job_for(state, seq, body.job_id)
    if body.epoch < state.epoch or job is None:
        return
    state.epoch = body.epoch
    if job.state != "PENDING" or body.attempt != job.restart_count or job.cancel_by is not None:
        return
    if job.held or _throttled(state, job):
        return
    nodes = [state.nodes.get(a.node) for a in body.allocations]
    distinct_nodes = len({a.node for a in body.allocations}) == len(body.allocations)
    if not distinct_nodes or any(len(set(a.gpus)) != len(a.gpus) for a in body.allocations):
        return
    if not body.allocations or any(
        n is None or not _fits(n, a) for n, a in zip(nodes, body.allocations, strict=True)
    ):
        return
    for node, alloc in zip(nodes, body.allocations, strict=True):
        assert node is not None
        node.used_gpus = sorted(node.used_gpus + list(alloc.gpus))
        node.alloc_cpus += alloc.cpus
        node.alloc_mem_mb += alloc.mem_mb
        node.jobs.append(job.job_id)
    job.state = "RUNNING"
    if job.array_job_id:
        state.array_running[job.array_job_id] = state.array_running.get(job.array_job_id, 0) + 1
    job.control = job.change = None
    job.partition = body.partition
    job.allocations = list(body.allocations)
    job.time_limit_s = body.time_limit_s
    job.start_time = at
    job.end_time = None
    job.run_started = False
    job.run_exit = None
    job.exited_nodes = []


def _throttled(state: State, job: Job) -> bool:
    """True if starting this array task would run more of its array's tasks at once than ``%P``."""
    limit = array_throttle(job)
    return limit > 0 and state.array_running.get(job.array_job_id, 0) >= limit


def _stopped_running(state: State, job: Job) -> None:
    """Account for a RUNNING array task that stops running (ends or is requeued)."""
    if not job.array_job_id:
        return
    left = state.array_running.get(job.array_job_id, 0) - 1
    if left > 0:
        state.array_running[job.array_job_id] = left
    else:
        state.array_running.pop(job.array_job_id, None)


def _current_run(job: Job | None, attempt: int, node: str) -> bool:
    return (
        job is not None
        and job.state == "RUNNING"
        and attempt == job.restart_count
        and bool(job.allocations)
        and job.allocations[0].node == node
    )


def _run_started(state: State, seq: int, at: float, body: ev.RunStarted) -> None:
    job = _job_for(state, seq, body.job_id)
    if _current_run(job, body.attempt, body.node):
        assert job is not None
        job.run_started = True


def _run_exited(state: State, seq: int, at: float, body: ev.RunExited) -> None:
    drop_orphans(state, lambda o: (o.job_id, o.attempt, o.node) == (body.job_id, body.attempt, body.node))
    job = _job_for(state, seq, body.job_id)
    if (
        job is not None
        and job.state == "RUNNING"
        and body.attempt == job.restart_count
        and body.node not in job.exited_nodes
        and any(a.node == body.node for a in job.allocations)
    ):
        job.exited_nodes.append(body.node)
    if _current_run(job, body.attempt, body.node) and job is not None and job.run_exit is None:
        job.run_exit = RunExit(
            exit_code=body.exit_code,
            signal=body.signal,
            oom=body.oom,
            timed_out=body.timed_out,
            launch_error=body.launch_error,
            killed=body.killed,
        )


def _release(state: State, job: Job) -> None:
    # Slurm's COMPLETING, on every node of the run: processes of the run may live on any of them (the batch
    # script, srun's tasks, what they started), also on a node that is down (its agent died, not its
    # processes). Each node keeps the run's resources until its own agent reports the run's processes there
    # gone (RunExited from that node: on its own, or after a kill order).
    orphaned = set()
    for alloc in job.allocations:
        if alloc.node in job.exited_nodes:
            continue
        orphaned.add(alloc.node)
        state.orphans.append(
            Orphan(
                job_id=job.job_id,
                attempt=job.restart_count,
                node=alloc.node,
                gpus=list(alloc.gpus),
                cpus=alloc.cpus,
                mem_mb=alloc.mem_mb,
            )
        )
    for alloc in job.allocations:
        node = state.nodes.get(alloc.node)
        if node is None:
            continue
        node.jobs = [j for j in node.jobs if j != job.job_id]
        if node.name in orphaned:
            continue
        held = set(alloc.gpus)
        node.used_gpus = [g for g in node.used_gpus if g not in held]
        node.alloc_cpus -= alloc.cpus
        node.alloc_mem_mb -= alloc.mem_mb


def _decision_job(state: State, seq: int, job_id: int, attempt: int) -> Job | None:
    """The job a conclusion is about, if it still applies to the job's current attempt."""
    job = _job_for(state, seq, job_id)
    if job is None or job.state not in ("PENDING", "RUNNING"):
        return None
    if job.state == "RUNNING" and attempt != job.restart_count:
        return None
    if job.state == "PENDING" and attempt != -1:
        return None
    return job


def _bill(state: State, job: Job, at: float) -> None:
    """Charge a run that ends now to its user's association."""
    if job.start_time is None or not job.allocations:
        return
    policy = state.usage_policy
    amount = billing(
        sum(len(a.gpus) for a in job.allocations),
        sum(a.cpus for a in job.allocations),
        sum(a.mem_mb for a in job.allocations),
        at - job.start_time,
        policy.weights,
    )
    charge(state.usage, user_key(job.user, job.spec.account or job.user), amount, at, policy.half_life_s)


def _end(state: State, job: Job, at: float, final: str) -> None:
    if job.state == "RUNNING":
        _bill(state, job, at)
        _release(state, job)
        _stopped_running(state, job)
    state.active.pop(job.job_id, None)
    job.state = final
    job.end_time = at
    _run_over(job)


def _run_over(job: Job) -> None:
    """Forget what was asked of a run that is over (requeue, signals)."""
    job.requeue_by, job.requeue_hold, job.signals = None, False, []


def _completed(state: State, seq: int, at: float, body: ev.JobCompleted) -> None:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if job is not None:
        _end(state, job, at, "COMPLETED")


_FAILED_STATE = {
    "NodeFail": "NODE_FAIL",
    "OutOfMemory": "OUT_OF_MEMORY",
    "TimeLimit": "TIMEOUT",
    "Preempted": "PREEMPTED",
}


def _failed(state: State, seq: int, at: float, body: ev.JobFailed) -> None:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if job is not None:
        job.exit_code, job.signal, job.end_reason = body.exit_code, body.signal, body.reason
        _end(state, job, at, _FAILED_STATE.get(body.reason, "FAILED"))


def _cancelled(state: State, seq: int, at: float, body: ev.JobCancelled) -> None:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if job is not None:
        job.cancel_by = body.by
        job.exit_code, job.signal = 0, body.signal
        _end(state, job, at, "CANCELLED")


def _requeued(state: State, seq: int, at: float, body: ev.JobRequeued) -> None:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if job is None or job.state != "RUNNING":
        return
    _bill(state, job, at)
    _release(state, job)
    _stopped_running(state, job)
    job.state = "PENDING"
    job.restart_count += 1
    job.allocations = []
    job.start_time = None
    job.run_started = False
    job.run_exit = None
    job.exited_nodes = []
    job.preempting = None
    _run_over(job)
    if body.hold:
        job.held = "user"


def _preempted(state: State, seq: int, at: float, body: ev.JobPreempted) -> None:
    job = _job_for(state, seq, body.job_id)
    if body.epoch < state.epoch or job is None:
        return
    state.epoch = body.epoch
    # Only a live run that is not ending already, and only once: a run is never preempted twice.
    if job.state != "RUNNING" or body.attempt != job.restart_count or job.preempting is not None:
        return
    if job.run_exit is not None or job.cancel_by is not None:
        return
    job.preempting = Preemption(mode=body.mode, grace_s=body.grace_s, at=at, by_job=body.by_job)


_HANDLERS: dict[type, Callable[[State, int, float, Any], None]] = {
    ev.JobCancelRequested: _cancel_requested,
    ev.JobAllocated: _allocated,
    ev.RunStarted: _run_started,
    ev.RunExited: _run_exited,
    ev.JobCompleted: _completed,
    ev.JobFailed: _failed,
    ev.JobCancelled: _cancelled,
    ev.JobRequeued: _requeued,
    ev.JobHoldRequested: _control_requested,
    ev.JobReleaseRequested: _control_requested,
    ev.JobHeld: _held,
    ev.JobReleased: _released,
    ev.JobUpdateRequested: _update_requested,
    ev.JobUpdated: _updated,
    ev.JobPreempted: _preempted,
    ev.JobRequeueRequested: _requeue_requested,
    ev.JobSignalRequested: _signal_requested,
    **NODE_HANDLERS,
    **RESERVATION_HANDLERS,
}
