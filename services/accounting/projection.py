"""The accounting projection, pure: log entries in, row operations out (no IO, no clock).

``convert(entries, default_partition)`` turns each event into the operations that bring the
``jobs`` and ``steps`` tables up to date; ``corral.services.accounting.sql`` executes them.

Every operation carries the stream sequence of its event and is applied only to rows whose
``last_seq`` is older, and only from the state the scheduler's fold (``corral.libs.core.state``)
would accept it in (e.g. an allocation only for a PENDING job whose restart count is the
attempt). A row therefore changes at most once per event and an entry that was refused once is
refused again, so applying the same entries twice — redelivery, a reset position, a replay onto
existing tables — changes nothing.

Job arrays: one row per task (a task is a job with its own id), inserted by one operation from the
array's submission: the task with the k-th smallest index gets the id ``job_id + k`` and records the
array's id and its index (``sacct`` prints ``A_T``). A whole-array cancel request marks every task row.

Updates: ``JobUpdated`` (``scontrol update`` of a pending job) rewrites a PENDING row's requested time
limit and partition, as the fold does the spec; the allocation later overwrites both with the run's.

Requeue semantics (Slurm-like, one row per job): a requeued job goes back to PENDING with its
restart count + 1, its start time and node list cleared and the requeue reason as its reason;
the batch step of the ended attempt stays, state REQUEUED, until the next allocation replaces it
with the new attempt's batch step. Only the latest attempt's batch step is kept.

Steps (srun): ``StepStarted`` inserts ``N.<step>`` for the job's running attempt, ``StepExited`` ends it;
a job's conclusion or requeue ends its steps still running (CANCELLED) and a new allocation drops the
numbered steps of older attempts, so sacct shows the latest attempt's steps, as Slurm does.
"""

from __future__ import annotations

import msgspec

from corral.libs.slurm import hostlist
from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.signals import shown_exit
from corral.schemas import events as ev


class InsertJob(msgspec.Struct, frozen=True, kw_only=True):
    """A submitted job: a new PENDING row (an existing row is left alone); for an array, one per task."""

    seq: int  # stream sequence of the event
    job_id: int  # id
    name: str  # job name
    user: str  # owner
    account: str  # requested account ("" = the user's default)
    partition: str  # requested partition, or the cluster's default
    submit_time: float  # Unix time of the submission
    time_limit_s: int | None  # requested limit (None = the partition's default)
    num_nodes: int  # nodes requested
    num_cpus: int  # CPUs requested (ntasks * cpus_per_task)
    num_gpus: int  # GPUs requested (nodes * gpus_per_node)
    workdir: str  # submit directory
    array_tasks: list[int] = []  # an array's indices, ascending: task k is job ``job_id + k``; [] = one job
    qos: str = ""  # the job's QOS as resolved at submit ("" = submitted before jobs carried one)


class RequestCancel(msgspec.Struct, frozen=True, kw_only=True):
    """A cancel was requested for a live job: a later allocation of it is void (as in the fold)."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    user: str  # who asked
    whole_array: bool = False  # job_id is an array's id: every task of it


class StartRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run was allocated: the job turns RUNNING and its batch step row is (re)written."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    attempt: int  # run number (= restart count)
    epoch: int  # leader epoch of the deciding scheduler (a stale epoch changes nothing)
    partition: str  # partition of the run
    start_time: float  # Unix time of the allocation
    time_limit_s: int | None  # the run's limit
    node_list: str  # compressed hostlist of the run's nodes
    num_nodes: int  # nodes allocated
    num_cpus: int  # CPUs allocated over all nodes
    num_gpus: int  # GPUs allocated over all nodes
    batch_node: str  # the node that runs the batch script
    batch_cpus: int  # CPUs of the batch step (those of the first node)
    batch_gpus: int  # GPUs of the batch step (those of the first node)


class ExitBatch(msgspec.Struct, frozen=True, kw_only=True):
    """The batch script of an attempt exited: its step ends, if it is that attempt's and running."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    attempt: int  # the run
    node: str  # the reporting node (must be the batch node)
    end_time: float  # Unix time of the exit
    state: str  # the step's final state
    exit_code: int  # exit code
    signal: int  # terminating signal, 0 if none


class EndJob(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler concluded the job: terminal state; a still-running batch step ends with it."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    attempt: int  # the concluded run, -1 if the job never ran
    state: str  # terminal JobState
    end_time: float  # Unix time of the conclusion
    exit_code: int  # batch exit code
    signal: int  # terminating signal
    reason: str  # EndReason of a failure, "None" otherwise
    cancelled_by: str | None  # who cancelled it (CANCELLED only)


class RequeueJob(msgspec.Struct, frozen=True, kw_only=True):
    """The run ended and the job is PENDING again, restart count + 1; its batch step ends REQUEUED."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    attempt: int  # the run that ended
    end_time: float  # Unix time of the requeue
    reason: str  # RequeueReason


class UpdateJob(msgspec.Struct, frozen=True, kw_only=True):
    """A pending job's time limit or partition changed (``scontrol update``): its row shows them."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    time_limit_s: int | None  # the requested limit now (None = the partition's default)
    partition: str  # the partition now, or the cluster's default


class StartStep(msgspec.Struct, frozen=True, kw_only=True):
    """A step (srun) of the job's running attempt started: a new ``N.<step>`` row."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    attempt: int  # the run
    step: str  # the step number, as text
    name: str  # step name
    start_time: float  # Unix time it started
    node_list: str  # compressed hostlist of its nodes
    num_cpus: int  # CPUs of its tasks
    num_tasks: int  # tasks
    num_gpus: int  # GPUs bound to its tasks


class EndStep(msgspec.Struct, frozen=True, kw_only=True):
    """A step's tasks all ended: its row ends with the worst task's exit."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    attempt: int  # the run
    step: str  # the step number, as text
    end_time: float  # Unix time
    state: str  # COMPLETED, FAILED or CANCELLED
    exit_code: int  # worst task's exit code
    signal: int  # a terminating signal, 0 if none


Op = InsertJob | RequestCancel | StartRun | ExitBatch | EndJob | RequeueJob | UpdateJob | StartStep | EndStep

#: The job state a JobFailed reason leads to (as in the scheduler's fold); FAILED otherwise.
FAILED_STATE: dict[str, str] = {
    "NodeFail": "NODE_FAIL",
    "OutOfMemory": "OUT_OF_MEMORY",
    "TimeLimit": "TIMEOUT",
    "Preempted": "PREEMPTED",
}


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
    match body:
        case ev.JobSubmitted(job_id=job_id, user=user, spec=spec):
            tasks = _array_tasks(spec)
            if tasks is None:
                return None
            return InsertJob(
                seq=seq,
                job_id=job_id,
                name=spec.name,
                user=user,
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
            )
        case ev.JobCancelRequested(job_id=job_id, user=user, whole_array=whole_array):
            return RequestCancel(seq=seq, job_id=job_id, user=user, whole_array=whole_array)
        case ev.JobAllocated():
            return _start_run(seq, at, body)
        case ev.RunExited():
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
        case ev.JobCompleted(job_id=job_id, attempt=attempt):
            return _end(seq, job_id, attempt, at, "COMPLETED")
        case ev.JobFailed(job_id=job_id, attempt=attempt, reason=reason):
            state = FAILED_STATE.get(reason, "FAILED")
            return _end(seq, job_id, attempt, at, state, body.exit_code, body.signal, reason)
        case ev.JobCancelled(job_id=job_id, attempt=attempt, by=by, signal=signal):
            return _end(seq, job_id, attempt, at, "CANCELLED", 0, signal, cancelled_by=by)
        case ev.JobRequeued(job_id=job_id, attempt=attempt, reason=reason):
            return RequeueJob(seq=seq, job_id=job_id, attempt=attempt, end_time=at, reason=reason)
        case ev.JobUpdated(job_id=job_id, time_limit_s=limit, partition=partition):
            # The admin priority (and a hold by Priority=0) has no accounting column.
            return UpdateJob(
                seq=seq, job_id=job_id, time_limit_s=limit, partition=partition or default_partition
            )
        case ev.StepStarted():
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
        case ev.StepExited():
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
    # Run starts and node events change no accounting row.
    return None


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
    )


def _end(
    seq: int,
    job_id: int,
    attempt: int,
    at: float,
    state: str,
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
