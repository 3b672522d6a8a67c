"""The row operations of the accounting projection (``projection.convert`` makes them, ``sql`` runs them).

Every operation carries the stream sequence of its event; ``sql`` applies it only to rows whose
``last_seq`` is older, so applying it twice changes nothing.
"""

from __future__ import annotations

import msgspec

from corral.schemas.lifecycle import JobState


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
    mem_mb: int | None = None  # memory requested over all nodes (None = the partition's default)
    gpu_type: str = ""  # GPU type of a typed request (gpu:h100:2); "" = any
    owner: int = 0  # of an array: only the tasks whose job id is ``owner`` mod ``owners`` (``owners.share``)
    owners: int = 1  # the accounting partitions (1: every task)


class RequestCancel(msgspec.Struct, frozen=True, kw_only=True):
    """A cancel was requested for a live job: a later allocation of it is void (as in the fold)."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    user: str  # who asked
    whole_array: bool = False  # job_id is an array's id: every task of it


class StartRun(msgspec.Struct, frozen=True, kw_only=True):
    """A run was allocated: the job turns RUNNING, the attempt gets its row, the batch step is (re)written."""

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
    mem_mb: int = 0  # memory allocated over all nodes, MiB


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
    state: JobState  # terminal state
    end_time: float  # Unix time of the conclusion
    exit_code: int  # batch exit code
    signal: int  # terminating signal
    reason: str  # EndReason of a failure, "None" otherwise
    cancelled_by: str | None  # who cancelled it (CANCELLED only)


class RequeueJob(msgspec.Struct, frozen=True, kw_only=True):
    """The run ended and the job is PENDING again, restart count + 1; its batch step ends REQUEUED and
    its attempt ``attempt_state``."""

    seq: int  # stream sequence of the event
    job_id: int  # the job
    attempt: int  # the run that ended
    end_time: float  # Unix time of the requeue
    reason: str  # RequeueReason
    attempt_state: str = (
        "REQUEUED"  # what sacct -D shows for the ended attempt: REQUEUED, NODE_FAIL, PREEMPTED
    )


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


class NodeChange(msgspec.Struct, frozen=True, kw_only=True):
    """A node's capacity or availability changed in the fold: its open period ends, a new one starts."""

    seq: int  # stream sequence of the event
    node: str  # the node
    at: float  # Unix time of the event
    cpus: int  # CPUs now
    gpus: int  # GPUs now
    available: bool  # False: down or drained


class RaiseEpoch(msgspec.Struct, frozen=True, kw_only=True):
    """The fold saw a newer scheduler leader epoch in a decision (fencing): the table keeps the highest."""

    seq: int  # stream sequence of the event
    epoch: int  # the epoch now


Op = (
    InsertJob
    | RequestCancel
    | StartRun
    | ExitBatch
    | EndJob
    | RequeueJob
    | UpdateJob
    | StartStep
    | EndStep
    | NodeChange
    | RaiseEpoch
)
