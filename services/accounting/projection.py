"""The accounting projection, pure: log entries in, row operations out (no IO, no clock).

``convert(entries, default_partition)`` turns each event into the operations that bring the
``jobs`` and ``steps`` tables up to date; ``corral.services.accounting.sql`` executes them.

Which entries are recorded at all is the scheduler fold's decision, not this module's: ``folded.Projector``
converts an entry only where the fold applied it, so the SQL repeats none of the fold's guards. Every
operation carries the stream sequence of its event and is applied only to rows whose ``last_seq`` is
older: a row changes at most once per event, so applying the same entries twice (redelivery, a reset
position, a replay onto existing tables) changes nothing. ``CONVERTERS`` and ``IGNORED`` list every event
type (a test checks).

Job arrays: one row per task (a task is a job with its own id), inserted by one operation from the
array's submission: the task with the k-th smallest index gets the id ``job_id + k`` and records the
array's id and its index (``sacct`` prints ``A_T``). A whole-array cancel request marks every task row
the fold marks (its live tasks).

Updates: ``JobUpdated`` (``scontrol update`` of a pending job) rewrites a PENDING row's requested time
limit and partition, as the fold does the spec; the allocation later overwrites both with the run's.

Requeue semantics (Slurm-like): the job's row is its latest record. A requeued job goes back to PENDING
with its restart count + 1, its start time and node list cleared and the requeue reason as its reason;
the batch step of the ended attempt ends REQUEUED and stays that attempt's; the next allocation writes
the new attempt's batch step beside it.

Attempts: every allocation also inserts an ``attempts`` row (job, attempt), with the run's nodes, CPUs,
GPUs and memory; the conclusion ends it with the job's state, a requeue with the state Slurm gives the
earlier record (``REQUEUE_STATES``: REQUEUED, NODE_FAIL, PREEMPTED). ``sacct -D`` shows them, ``sreport``
sums them. Node capacity over time (``node_periods``) comes from the fold's node state (``folded``).

Steps (srun): ``StepStarted`` inserts ``N.<step>`` for the job's running attempt, ``StepExited`` ends it;
a job's conclusion or requeue ends its steps still running (CANCELLED). Every step row is one attempt's
(``(job, attempt, step)``), as Slurm's step records belong to the job record they ran in: sacct shows the
latest attempt's steps, ``sacct -D`` each attempt's under that attempt (``query.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from corral.libs.slurm import hostlist
from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.signals import shown_exit
from corral.schemas import events as ev
from corral.schemas import lifecycle
from corral.services.accounting.ops import (
    EndJob as EndJob,
)
from corral.services.accounting.ops import (
    EndStep as EndStep,
)
from corral.services.accounting.ops import (
    ExitBatch as ExitBatch,
)
from corral.services.accounting.ops import (
    InsertJob as InsertJob,
)
from corral.services.accounting.ops import (
    NodeChange as NodeChange,
)
from corral.services.accounting.ops import (
    Op as Op,
)
from corral.services.accounting.ops import (
    RaiseEpoch as RaiseEpoch,
)
from corral.services.accounting.ops import (
    RequestCancel as RequestCancel,
)
from corral.services.accounting.ops import (
    RequeueJob as RequeueJob,
)
from corral.services.accounting.ops import (
    StartRun as StartRun,
)
from corral.services.accounting.ops import (
    StartStep as StartStep,
)
from corral.services.accounting.ops import (
    UpdateJob as UpdateJob,
)


def convert(entries: list[tuple[int, ev.Envelope]], default_partition: str = "") -> list[Op]:
    """The operations that project ``entries`` (stream sequence, envelope), in log order."""
    ops: list[Op] = []
    for seq, env in entries:
        op = _op(seq, env.meta.occurred_at, env.body, default_partition)
        if op is not None:
            ops.append(op)
    return ops


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    """What to do with one delivered batch, given the consumer's stored position."""

    entries: list[tuple[int, ev.Envelope]]  # entries to project now, in log order
    position: int  # the position once they are applied (past undecodable entries too)
    rejected: list[int]  # sequences of undecodable entries: dead-letter them
    waiting_for: int | None = None  # an earlier entry is missing (delivered elsewhere, or later)


def plan_batch(delivered: list[tuple[int, ev.Envelope | None]], position: int) -> Batch:
    """Split a delivery into entries already applied, entries to apply, and what cannot apply yet.

    Entries apply strictly in log order: the position only moves to the next sequence. Entries
    at or below the position were applied before (a redelivery) and are skipped; an entry after a
    missing one waits, because the missing one (held by another consumer, or redelivered later)
    must be applied first. An undecodable entry is never applied; the position moves past it.
    """
    apply: list[tuple[int, ev.Envelope]] = []
    rejected: list[int] = []
    waiting_for: int | None = None
    for seq, env in sorted(delivered, key=lambda item: item[0]):
        if seq > position + 1:
            waiting_for = position + 1
            break
        if env is None:
            rejected.append(seq)
        elif seq == position + 1:
            apply.append((seq, env))
        position = max(position, seq)
    return Batch(entries=apply, position=position, rejected=rejected, waiting_for=waiting_for)


def batch_state(exit: ev.RunExited) -> str:
    """The state of a batch step that ended as ``exit`` reports."""
    if exit.oom:
        return "OUT_OF_MEMORY"
    if exit.timed_out:
        return "TIMEOUT"
    if exit.killed:
        return "CANCELLED"
    if exit.launch_error is not None or exit.exit_code != 0 or exit.signal != 0:
        return "FAILED"
    return "COMPLETED"


def step_state(exit: ev.StepExited) -> str:
    """The state of a step that ended as ``exit`` reports."""
    if exit.killed:
        return "CANCELLED"
    if exit.oom:
        return "OUT_OF_MEMORY"
    return "FAILED" if exit.exit_code != 0 or exit.signal != 0 else "COMPLETED"


def node_list(nodes: list[str]) -> str:
    """The compressed hostlist of ``nodes`` (plain comma-joined if a name is not a valid host)."""
    try:
        return hostlist.compress(nodes)
    except FormatError:
        # The scheduler names the nodes; a name hostlist rejects must still be recorded, not lost.
        return ",".join(nodes)


def _op(seq: int, at: float, body: ev.Event, default_partition: str) -> Op | None:
    converter = CONVERTERS.get(type(body))
    return None if converter is None else converter(seq, at, body, default_partition)


def _submitted(seq: int, at: float, body: ev.JobSubmitted, default_partition: str) -> Op | None:
    spec = body.spec
    tasks = _array_tasks(spec)
    if tasks is None:
        return None
    return InsertJob(
        seq=seq,
        job_id=body.job_id,
        name=spec.name,
        user=body.user,
        account=spec.account or "",
        partition=spec.partition or default_partition,
        submit_time=at,
        time_limit_s=spec.time_limit_s,
        num_nodes=spec.nodes,
        num_cpus=spec.ntasks * spec.cpus_per_task,
        num_gpus=spec.nodes * spec.gpus_per_node,
        workdir=spec.workdir,
        array_tasks=tasks,
        qos=spec.qos or "",
        mem_mb=None if spec.mem_per_node_mb is None else spec.nodes * spec.mem_per_node_mb,
        gpu_type=spec.gpu_type or "",
    )


def _cancel_requested(seq: int, at: float, body: ev.JobCancelRequested, default_partition: str) -> Op:
    return RequestCancel(seq=seq, job_id=body.job_id, user=body.user, whole_array=body.whole_array)


def _run_exited(seq: int, at: float, body: ev.RunExited, default_partition: str) -> Op:
    # An OOM-killed batch step shows Slurm's 0:125, as its job does.
    exit_code, signal = shown_exit(body.exit_code, body.signal, body.oom)
    return ExitBatch(
        seq=seq,
        job_id=body.job_id,
        attempt=body.attempt,
        node=body.node,
        end_time=at,
        state=batch_state(body),
        exit_code=exit_code,
        signal=signal,
    )


def _completed(seq: int, at: float, body: ev.JobCompleted, default_partition: str) -> Op:
    return _end(seq, body.job_id, body.attempt, at, "COMPLETED")


def _failed(seq: int, at: float, body: ev.JobFailed, default_partition: str) -> Op:
    state = lifecycle.failed_state(body.reason)
    return _end(seq, body.job_id, body.attempt, at, state, body.exit_code, body.signal, body.reason)


def _cancelled(seq: int, at: float, body: ev.JobCancelled, default_partition: str) -> Op:
    return _end(seq, body.job_id, body.attempt, at, "CANCELLED", 0, body.signal, cancelled_by=body.by)


#: The state sacct -D shows for an attempt that ended in a requeue, by the requeue's reason (as Slurm's
#: earlier job records: a node failure is NODE_FAIL, a preemption PREEMPTED, scontrol requeue REQUEUED).
REQUEUE_STATES: dict[str, str] = {"NodeFail": "NODE_FAIL", "Preempted": "PREEMPTED", "Requested": "REQUEUED"}


def _requeued(seq: int, at: float, body: ev.JobRequeued, default_partition: str) -> Op:
    return RequeueJob(
        seq=seq,
        job_id=body.job_id,
        attempt=body.attempt,
        end_time=at,
        reason=body.reason,
        attempt_state=REQUEUE_STATES.get(body.reason, "REQUEUED"),
    )


def _updated(seq: int, at: float, body: ev.JobUpdated, default_partition: str) -> Op:
    # The admin priority (and a hold by Priority=0) has no accounting column.
    partition = body.partition or default_partition
    return UpdateJob(seq=seq, job_id=body.job_id, time_limit_s=body.time_limit_s, partition=partition)


def _step_started(seq: int, at: float, body: ev.StepStarted, default_partition: str) -> Op:
    return StartStep(
        seq=seq,
        job_id=body.job_id,
        attempt=body.attempt,
        step=str(body.step_id),
        name=body.name,
        start_time=at,
        node_list=node_list(list(body.nodes)),
        num_cpus=body.cpus,
        num_tasks=body.ntasks,
        num_gpus=body.gpus,
    )


def _step_exited(seq: int, at: float, body: ev.StepExited, default_partition: str) -> Op:
    exit_code, signal = shown_exit(body.exit_code, body.signal, body.oom and not body.killed)
    return EndStep(
        seq=seq,
        job_id=body.job_id,
        attempt=body.attempt,
        step=str(body.step_id),
        end_time=at,
        state=step_state(body),
        exit_code=exit_code,
        signal=signal,
    )


def _allocated(seq: int, at: float, body: ev.JobAllocated, default_partition: str) -> Op:
    return _start_run(seq, at, body)


#: The row operation of each event type accounting records: (seq, occurred_at, body, default partition).
CONVERTERS: dict[type, Callable[[int, float, Any, str], Op | None]] = {
    ev.JobSubmitted: _submitted,
    ev.JobCancelRequested: _cancel_requested,
    ev.JobAllocated: _allocated,
    ev.RunExited: _run_exited,
    ev.JobCompleted: _completed,
    ev.JobFailed: _failed,
    ev.JobCancelled: _cancelled,
    ev.JobRequeued: _requeued,
    ev.JobUpdated: _updated,
    ev.StepStarted: _step_started,
    ev.StepExited: _step_exited,
}

_NO_COLUMN = "has no accounting column"
#: The event types accounting records nothing of, and why.
IGNORED: dict[type, str] = {
    ev.RunStarted: "the start sacct shows is the allocation's (Slurm's Start); the script's pid is not kept",
    ev.JobHoldRequested: "an intent; the scheduler's JobHeld answers it",
    ev.JobReleaseRequested: "an intent; the scheduler's JobReleased answers it",
    ev.JobUpdateRequested: "an intent; the scheduler's JobUpdated answers it",
    ev.JobRequeueRequested: "an intent; the scheduler's JobRequeued concludes it",
    ev.JobSignalRequested: "a signal that does not end the run " + _NO_COLUMN,
    ev.JobHeld: "a hold " + _NO_COLUMN,
    ev.JobReleased: "a release " + _NO_COLUMN,
    ev.JobPreempted: "a kill order; the conclusion that follows is recorded",
    ev.JobReasonChanged: "a pending reason: squeue shows it; the Reason column is the end's",
    **dict.fromkeys(ev.NODE_EVENTS, "no job or step row; node_periods come from the fold's node state"),
    **dict.fromkeys(ev.RESERVATION_EVENTS, "reservations " + _NO_COLUMN),
}


def _array_tasks(spec: ev.JobSpec) -> list[int] | None:
    """The indices of an array submission, [] for a single job, None for an array the fold refuses."""
    if spec.array is None:
        return []
    try:
        return array_indices(spec.array)
    except FormatError:
        return None


def _start_run(seq: int, at: float, body: ev.JobAllocated) -> StartRun:
    # An empty allocation still raises the fencing epoch, as in the fold; the SQL refuses the rest.
    first = body.allocations[0] if body.allocations else ev.NodeAllocation(node=ev.NodeName(""), cpus=0)
    return StartRun(
        seq=seq,
        job_id=body.job_id,
        attempt=body.attempt,
        epoch=body.epoch,
        partition=body.partition,
        start_time=at,
        time_limit_s=body.time_limit_s,
        node_list=node_list([a.node for a in body.allocations]),
        num_nodes=len(body.allocations),
        num_cpus=sum(a.cpus for a in body.allocations),
        num_gpus=sum(len(a.gpus) for a in body.allocations),
        batch_node=first.node,
        batch_cpus=first.cpus,
        batch_gpus=len(first.gpus),
        mem_mb=sum(a.mem_mb for a in body.allocations),
    )


def _end(
    seq: int,
    job_id: int,
    attempt: int,
    at: float,
    state: lifecycle.JobState,
    exit_code: int = 0,
    signal: int = 0,
    reason: str = "None",
    cancelled_by: str | None = None,
) -> EndJob:
    return EndJob(
        seq=seq,
        job_id=job_id,
        attempt=attempt,
        state=state,
        end_time=at,
        exit_code=exit_code,
        signal=signal,
        reason=reason,
        cancelled_by=cancelled_by,
    )
