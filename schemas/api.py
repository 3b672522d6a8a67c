"""API messages (``corral.api.v1.<verb>.<user>``, request/reply) and per-node orders.

Every reply is either the verb's reply Struct or an ``ApiError``; both are tagged, so a client
decodes ``Reply | ApiError``. The caller's identity is never in a request body: it is the last
token of the subject, which the NATS server binds to the authenticated connection.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.schemas.events import JobSpec, NodeAllocation

JobState = Literal[
    "PENDING",
    "RUNNING",
    "REQUEUED",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
]

#: States from which a job never moves again.
TERMINAL_STATES: frozenset[str] = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
)

#: API verbs and the service that answers each.
VERBS: dict[str, str] = {
    "submit": "gateway",
    "cancel": "gateway",
    "hold": "gateway",
    "release": "gateway",
    "update": "gateway",
    "jobs": "scheduler",
    "nodes": "scheduler",
    "acct": "accounting",
}


class ApiError(msgspec.Struct, frozen=True, tag="error", kw_only=True):
    """A rejected request: nothing was appended to the log."""

    error: str  # one line for the user, naming the problem and the fix
    field: str | None = None  # the request field at fault, if one is
    code: str = "invalid"  # invalid | forbidden | not_found | unavailable | internal
    retryable: bool = False  # whether the same request may succeed later


# --- submit ---------------------------------------------------------------------------------------


class SubmitRequest(msgspec.Struct, frozen=True, tag="submit", kw_only=True):
    """sbatch: submit one batch job."""

    token: str  # client-chosen idempotency token: a retry with the same token gets the same job id
    spec: JobSpec  # the job


class SubmitReply(msgspec.Struct, frozen=True, tag="submitted", kw_only=True):
    """The job was accepted and appended to the log."""

    job_id: int  # the new job's id


# --- cancel ---------------------------------------------------------------------------------------


class ArrayTasks(msgspec.Struct, frozen=True, kw_only=True):
    """Some tasks of a job array, by index: ``A_T`` or ``A_[1-3,7]``."""

    array_job_id: int  # the array's id (its first task's job id)
    task_ids: list[int]  # the tasks' indices (SLURM_ARRAY_TASK_ID)


class CancelRequest(msgspec.Struct, frozen=True, tag="cancel", kw_only=True):
    """scancel: cancel jobs. An array's id (``scancel A``) cancels every task of the array."""

    job_ids: list[int]  # jobs to cancel
    tasks: list[ArrayTasks] = []  # array tasks to cancel by index (``scancel A_T``, ``A_[1-3]``)


class CancelOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one job of a cancel request."""

    job_id: int  # the job (the array's id for a task named by index)
    error: str | None = None  # None if the cancel request was recorded (or the job already ended)
    array_task_id: int | None = None  # the task's index when it was named as ``A_T``


class CancelReply(msgspec.Struct, frozen=True, tag="cancel_reply", kw_only=True):
    """Outcome per job."""

    outcomes: list[CancelOutcome]  # one per requested job


# --- hold / release / update (scontrol hold, release, update JobId=) --------------------------------


class HoldRequest(msgspec.Struct, frozen=True, tag="hold", kw_only=True):
    """scontrol hold: keep pending jobs from starting (JobHeldUser; JobHeldAdmin when an admin asks)."""

    job_ids: list[int]  # jobs to hold (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to hold by index


class ReleaseRequest(msgspec.Struct, frozen=True, tag="release", kw_only=True):
    """scontrol release: let held jobs be scheduled again."""

    job_ids: list[int]  # jobs to release (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to release by index


class UpdateRequest(msgspec.Struct, frozen=True, tag="update", kw_only=True):
    """scontrol update JobId=...: change a pending job (TimeLimit, Partition); None leaves a field as is.

    A user may only lower a time limit; an admin may also raise it (as in Slurm).
    """

    job_id: int  # the job
    time_limit_s: int | None = None  # new TimeLimit in seconds
    partition: str | None = None  # new Partition


class JobOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What happened to one job of a hold, release or update request."""

    job_id: int  # the job (the array's id for a task named by index)
    error: str | None = None  # None if the request was recorded; Slurm's wording otherwise
    array_task_id: int | None = None  # the task's index when it was named as ``A_T``


class ControlReply(msgspec.Struct, frozen=True, tag="control_reply", kw_only=True):
    """Outcome per job of a hold, release or update request."""

    outcomes: list[JobOutcome]  # one per requested job


# --- jobs (squeue) ----------------------------------------------------------------------------------


class JobsRequest(msgspec.Struct, frozen=True, tag="jobs", kw_only=True):
    """squeue: the live queue (pending and running jobs), filtered."""

    job_ids: list[int] = []  # only these jobs (empty: all); an array's id selects all its tasks
    users: list[str] = []  # only these users
    partitions: list[str] = []  # only these partitions
    states: list[str] = []  # only these states
    include_finished: bool = False  # also jobs that ended recently (squeue -j of a finished job)


class JobInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One job as the scheduler sees it now."""

    job_id: int  # id
    name: str  # job name
    user: str  # owner
    account: str  # account
    partition: str  # partition (requested or default)
    state: str  # JobState
    reason: str  # pending reason (Priority, Resources, ...) or "None"
    submit_time: float  # Unix time
    start_time: float | None  # Unix time of the current run's start
    end_time: float | None  # Unix time the job ended
    time_limit_s: int | None  # effective limit
    num_nodes: int  # nodes requested / allocated
    num_cpus: int  # CPUs requested / allocated
    num_tasks: int  # tasks
    gpus_per_node: int  # GPUs per node
    gpu_type: str | None  # GPU type requested
    min_memory_mb: int | None  # memory per node requested
    node_list: str  # compressed hostlist of the allocation ("" if pending)
    restart_count: int  # runs before the current one
    priority: int  # priority value (higher runs first)
    workdir: str  # submit directory
    exit_code: int = 0  # batch exit code (if ended)
    signal: int = 0  # terminating signal (if ended)
    dependency: str = ""  # Slurm's Dependency= text of the conditions not yet met, "" if none
    begin_time: float | None = None  # -b: Unix time before which the job may not start
    stdout: str | None = None  # -o pattern as submitted (None: slurm-%j.out)
    stderr: str | None = None  # -e pattern as submitted (None: with stdout)
    requeue: bool = True  # may be requeued
    array_job_id: int = 0  # the array's id for an array task (its first task's id), 0 otherwise
    array_task_id: int | None = None  # the task's index (SLURM_ARRAY_TASK_ID), None if not an array task
    array_throttle: int = 0  # the array's %P limit of running tasks, 0 = none
    switches: int = 0  # --switches count (most topology blocks), 0 = none
    switches_wait_s: int = 0  # how long the job waits for that count (capped by max_switch_wait)
    segment: int = 0  # --segment size (nodes per block-local segment), 0 = none


class JobsReply(msgspec.Struct, frozen=True, tag="jobs_reply", kw_only=True):
    """The matching jobs, in queue order."""

    jobs: list[JobInfo]  # matches


# --- nodes (sinfo) -----------------------------------------------------------------------------------


class NodesRequest(msgspec.Struct, frozen=True, tag="nodes", kw_only=True):
    """sinfo: nodes and partitions."""

    partitions: list[str] = []  # only nodes of these partitions


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One node's inventory and state."""

    name: str  # node name
    state: str  # idle | mixed | allocated | down | drained | unknown
    reason: str  # why down/drained ("" otherwise)
    cpus: int  # CPUs
    alloc_cpus: int  # allocated CPUs
    mem_mb: int  # memory MiB
    alloc_mem_mb: int  # allocated memory MiB
    gpus: int  # GPUs
    alloc_gpus: int  # allocated GPUs
    gpu_type: str | None  # GPU model
    partitions: list[str]  # partitions it belongs to
    features: list[str] = []  # features


class PartitionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One partition's configuration."""

    name: str  # name
    default: bool  # the default partition
    max_time_s: int | None  # MaxTime (None = UNLIMITED)
    default_time_s: int | None  # DefaultTime
    nodes: list[str]  # configured node names


class NodesReply(msgspec.Struct, frozen=True, tag="nodes_reply", kw_only=True):
    """Nodes and partitions."""

    nodes: list[NodeInfo]  # nodes, sorted by name
    partitions: list[PartitionInfo]  # partitions, in config order


# --- acct (sacct) -----------------------------------------------------------------------------------


class AcctRequest(msgspec.Struct, frozen=True, tag="acct", kw_only=True):
    """sacct: accounting records from the read model."""

    job_ids: list[int] = []  # only these jobs (empty: all matching the others); an array's id: its tasks
    users: list[str] = []  # only these users (empty: all)
    accounts: list[str] = []  # only these accounts
    states: list[str] = []  # only jobs in these states
    start_after: float | None = None  # -S: jobs that were eligible/ran after this time
    end_before: float | None = None  # -E: jobs that started before this time
    limit: int = 10000  # at most this many jobs


class AcctStep(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a job (``N.batch``, ``N.0``)."""

    step: str  # "batch" or a step number
    name: str  # step name ("batch" for the batch step)
    state: str  # step state
    exit_code: int  # exit code
    signal: int  # terminating signal
    start_time: float | None  # Unix time
    end_time: float | None  # Unix time
    node_list: str  # nodes of the step
    num_cpus: int  # CPUs
    num_tasks: int  # tasks
    num_gpus: int  # GPUs


class AcctJob(msgspec.Struct, frozen=True, kw_only=True):
    """One job's accounting record."""

    job_id: int  # id
    name: str  # job name
    user: str  # owner
    account: str  # account
    partition: str  # partition
    state: str  # JobState of the job
    cancelled_by: str | None  # user who cancelled it (CANCELLED by <user>)
    exit_code: int  # batch exit code
    signal: int  # terminating signal
    submit_time: float  # Unix time
    start_time: float | None  # Unix time of the last run's start
    end_time: float | None  # Unix time the job ended
    time_limit_s: int | None  # limit
    num_nodes: int  # nodes
    num_cpus: int  # CPUs allocated (requested if never ran)
    num_gpus: int  # GPUs allocated in total
    node_list: str  # nodes of the last run
    restart_count: int  # requeues
    workdir: str  # submit directory
    reason: str  # end or pending reason
    steps: list[AcctStep] = []  # steps, batch first
    array_job_id: int | None = None  # the array's id for an array task, None otherwise
    array_task_id: int | None = None  # the task's index for an array task, None otherwise


class AcctReply(msgspec.Struct, frozen=True, tag="acct_reply", kw_only=True):
    """Matching accounting records, by job id."""

    jobs: list[AcctJob]  # matches


Request = (
    SubmitRequest
    | CancelRequest
    | JobsRequest
    | NodesRequest
    | AcctRequest
    | HoldRequest
    | ReleaseRequest
    | UpdateRequest
)


# --- orders (corral.work.<node>) ---------------------------------------------------------------------


class LaunchOrder(msgspec.Struct, frozen=True, tag="launch", kw_only=True):
    """Start the batch script of a run on this node (the run's first node)."""

    job_id: int  # job
    attempt: int  # run number (SLURM_RESTART_COUNT)
    node: str  # the node that runs it
    user: str  # owner
    account: str  # account
    partition: str  # partition
    spec: JobSpec  # the job as submitted
    allocations: list[NodeAllocation]  # the whole run's allocation, first node first
    time_limit_s: int | None  # limit of this run
    cluster: str  # cluster name (SLURM_CLUSTER_NAME)
    traceparent: str | None = None  # trace context of the job
    array_job_id: int = 0  # the array's id for an array task (SLURM_ARRAY_JOB_ID, %A), 0 otherwise
    array_task_id: int | None = None  # the task's index (SLURM_ARRAY_TASK_ID, %a), None if not a task


class KillOrder(msgspec.Struct, frozen=True, tag="kill", kw_only=True):
    """Kill a run on this node (cancel, requeue, lost peer): SIGCONT+SIGTERM, SIGKILL after KillWait."""

    job_id: int  # job
    attempt: int  # run number
    node: str  # the node
    reason: str  # "cancel" | "requeue" | "node_fail"


Order = LaunchOrder | KillOrder


def order_msg_id(order: Order) -> str:
    """Deterministic message id, so a republished order is deduplicated."""
    kind = "launch" if isinstance(order, LaunchOrder) else "kill"
    return f"{order.job_id}:{order.attempt}:{order.node}:{kind}"
