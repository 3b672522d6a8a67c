"""API messages (``corral.api.v1.<verb>.<user>``, request/reply); per-node orders are in ``orders.py``
(re-exported here).

Every reply is either the verb's reply Struct or an ``ApiError``; both are tagged, so a client
decodes ``Reply | ApiError``. The caller's identity is never in a request body: it is the last
token of the subject, which the NATS server binds to the authenticated connection.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.schemas.events import JobSpec, SignalScope
from corral.schemas.lifecycle import TERMINAL_STATES as TERMINAL_STATES
from corral.schemas.orders import KillOrder as KillOrder
from corral.schemas.orders import LaunchOrder as LaunchOrder
from corral.schemas.orders import Order as Order
from corral.schemas.orders import SignalOrder as SignalOrder
from corral.schemas.orders import order_msg_id as order_msg_id

#: A job's state as shown by squeue and sacct: the fold's ``lifecycle.JobState`` and, for a batch step whose
#: run was requeued, REQUEUED.
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
    "PREEMPTED",
]


#: API verbs and the service that answers each.
VERBS: dict[str, str] = {
    "submit": "gateway",
    "cancel": "gateway",
    "hold": "gateway",
    "release": "gateway",
    "update": "gateway",
    "requeue": "gateway",
    "signal": "gateway",
    "jobs": "scheduler",
    "will_run": "scheduler",
    "nodes": "scheduler",
    "priority": "scheduler",
    "shares": "scheduler",
    "acct": "accounting",
    "create_reservation": "gateway",
    "delete_reservation": "gateway",
    "reservations": "scheduler",
    "update_node": "gateway",
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
    test_only: bool = (
        False  # sbatch --test-only: validate and estimate the start (WillRunReply), append nothing
    )


class SubmitReply(msgspec.Struct, frozen=True, tag="submitted", kw_only=True):
    """The job was accepted and appended to the log."""

    job_id: int  # the new job's id


class WillRunRequest(msgspec.Struct, frozen=True, tag="will_run", kw_only=True):
    """The gateway -> the scheduler, for ``sbatch --test-only``: when would this validated job start?"""

    user: str  # who would submit it
    spec: JobSpec  # the job, as the gateway would append it (partition, account and QOS resolved)


class WillRunReply(msgspec.Struct, frozen=True, tag="will_run_reply", kw_only=True):
    """The estimate for a job that was validated but not submitted (``sbatch --test-only``)."""

    job_id: int  # the id it was planned under (about the id it would get)
    start: float | None  # Unix time it would start (now: at once); None: not within the backfill window
    nodes: list[str] = []  # the nodes it would get at once ([] if it would wait)
    cpus: int = 0  # the CPUs it would be allocated
    partition: str = ""  # its partition
    reason: str = ""  # its pending reason if it would wait


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
    priority: int | None = None  # new absolute Priority (admin only); 0 holds the job (JobHeldAdmin)


class RequeueRequest(msgspec.Struct, frozen=True, tag="requeue", kw_only=True):
    """scontrol requeue[hold]: kill running jobs and put them back in the queue under the same id."""

    job_ids: list[int]  # jobs to requeue (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to requeue by index
    hold: bool = False  # requeuehold: held once pending again (a pending job is just held)


class SignalRequest(msgspec.Struct, frozen=True, tag="signal", kw_only=True):
    """scancel -s SIG (a signal that does not cancel): signal running jobs without ending them."""

    job_ids: list[int]  # jobs to signal (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to signal by index
    signal: int  # signal number, 1-64
    scope: SignalScope = "steps"  # steps (default) | batch (scancel -b) | full (scancel -f)


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
    qos: str = ""  # the job's QOS (squeue %q)
    nice: int = 0  # the job's nice value (scontrol show job Nice=)
    switches: int = 0  # --switches count (most topology blocks), 0 = none
    switches_wait_s: int = 0  # how long the job waits for that count (capped by max_switch_wait)
    segment: int = 0  # --segment size (nodes per block-local segment), 0 = none
    run_started: bool = False  # the batch node's agent started the current run (RunStarted): steps may begin


class JobsReply(msgspec.Struct, frozen=True, tag="jobs_reply", kw_only=True):
    """The matching jobs, in queue order."""

    jobs: list[JobInfo]  # matches


# --- priority (sprio) ------------------------------------------------------------------------------


class PriorityFactors(msgspec.Struct, frozen=True, kw_only=True):
    """A pending job's priority factors, each already multiplied by its weight (sprio's columns)."""

    site: float = 0.0  # SITE: a site's own factor (0: Corral has no site factor)
    age: float = 0.0  # AGE: PriorityWeightAge x the age factor
    fairshare: float = 0.0  # FAIRSHARE: PriorityWeightFairshare x the fair-share factor
    job_size: float = 0.0  # JOBSIZE: PriorityWeightJobSize x the job-size factor
    partition: float = 0.0  # PARTITION: PriorityWeightPartition x the partition's tier factor
    qos: float = 0.0  # QOS: PriorityWeightQOS x the QOS factor
    nice: float = 0.0  # NICE: the job's nice value, subtracted


class PriorityRequest(msgspec.Struct, frozen=True, tag="priority", kw_only=True):
    """sprio: the priority factors of pending jobs."""

    job_ids: list[int] = []  # only these jobs (empty: all pending); an array's id selects its tasks
    users: list[str] = []  # only these users


class JobPriority(msgspec.Struct, frozen=True, kw_only=True):
    """One pending job's priority and its factors."""

    job_id: int  # id
    user: str  # owner
    account: str  # account
    partition: str  # partition
    priority: int  # the priority it is scheduled with (0: held; an admin-set value when set)
    factors: PriorityFactors  # the weighted factors of its computed priority
    admin_set: bool = False  # the priority was set by an admin (scontrol update Priority=)
    array_job_id: int = 0  # the array's id for an array task, 0 otherwise
    array_task_id: int | None = None  # the task's index, None if not an array task


class PriorityWeightsInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The configured priority weights (sprio -w)."""

    age: int  # PriorityWeightAge
    fairshare: int  # PriorityWeightFairshare
    job_size: int  # PriorityWeightJobSize
    partition: int  # PriorityWeightPartition
    qos: int = 0  # PriorityWeightQOS
    site: int = 0  # site factor weight


class PriorityReply(msgspec.Struct, frozen=True, tag="priority_reply", kw_only=True):
    """The matching pending jobs, in queue order, and the weights."""

    jobs: list[JobPriority]  # matches
    weights: PriorityWeightsInfo  # the weights in force


# --- shares (sshare) ---------------------------------------------------------------------------------


class SharesRequest(msgspec.Struct, frozen=True, tag="shares", kw_only=True):
    """sshare: the fair-share tree with usage and factors."""

    users: list[str] = []  # only these users' associations (and the accounts above them)
    accounts: list[str] = []  # only these accounts and what is beneath them
    all_users: bool = False  # -a: every user association (default: only the caller's)


class ShareInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One association of the fair-share tree (an account, or a user in an account)."""

    account: str  # the account (a user row: the account the user charges)
    user: str  # the user, "" for an account row
    depth: int  # depth under root (root 0), for indenting
    raw_shares: int  # RawShares
    norm_shares: float  # NormShares: shares over the siblings' shares
    raw_usage: float  # RawUsage: decayed usage (TRES-seconds)
    effective_usage: float  # EffectvUsage: usage over the parent's usage
    fairshare: float | None  # FairShare factor of a user association; None for an account
    level_fs: float | None = None  # LevelFS (sshare -l); None = infinite (no usage)


class SharesReply(msgspec.Struct, frozen=True, tag="shares_reply", kw_only=True):
    """The tree in depth-first order, root first."""

    rows: list[ShareInfo]  # associations


# --- nodes (sinfo) -----------------------------------------------------------------------------------


class NodesRequest(msgspec.Struct, frozen=True, tag="nodes", kw_only=True):
    """sinfo: nodes and partitions."""

    partitions: list[str] = []  # only nodes of these partitions


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One node's inventory and state."""

    name: str  # node name
    state: str  # idle | mixed | allocated | reserved | down | draining (jobs still run) | drained | unknown
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
    drained: bool = False  # a drain is set (admin or registration), whatever the state (DOWN+DRAIN)
    reason_user: str = ""  # who set the reason: the admin of a drain, "" when Corral did
    reason_time: float | None = None  # when the admin drained it (Unix seconds); None if not known
    admin_down: bool = False  # state down because an admin downed it (it responds: DOWN, not DOWN*)


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
    qos: str = ""  # the job's QOS ("" = submitted before jobs carried one)


class AcctReply(msgspec.Struct, frozen=True, tag="acct_reply", kw_only=True):
    """Matching accounting records, by job id."""

    jobs: list[AcctJob]  # matches


# --- reservations (scontrol create/delete/show reservation) -----------------------------------------


class CreateReservationRequest(msgspec.Struct, frozen=True, tag="create_reservation", kw_only=True):
    """scontrol create reservation (admins only): exactly one of nodes, node_count, gpu_count.

    The gateway appends the intent and waits (bounded) for the scheduler's answer.
    """

    name: str  # ReservationName
    start_time: float  # StartTime, Unix seconds
    end_time: float  # EndTime, Unix seconds
    nodes: list[str] = []  # Nodes= (expanded hostlist)
    node_count: int = 0  # NodeCnt=
    gpu_count: int = 0  # TRES=gres/gpu=N
    partition: str | None = None  # PartitionName=; None = the default partition
    users: list[str] = []  # Users=
    accounts: list[str] = []  # Accounts=
    flags: list[str] = []  # Flags= (MAINT, IGNORE_JOBS)


class DeleteReservationRequest(msgspec.Struct, frozen=True, tag="delete_reservation", kw_only=True):
    """scontrol delete ReservationName=NAME (admins only)."""

    name: str  # the reservation


class ReservationReply(msgspec.Struct, frozen=True, tag="reservation_reply", kw_only=True):
    """The scheduler created or deleted the reservation."""

    name: str  # the reservation


class ReservationsRequest(msgspec.Struct, frozen=True, tag="reservations", kw_only=True):
    """scontrol show reservation [NAME]."""

    names: list[str] = []  # only these (empty: all)


class ReservationInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One reservation as the scheduler knows it."""

    name: str  # ReservationName
    start_time: float  # StartTime
    end_time: float  # EndTime
    nodes: list[str]  # nodes, sorted
    gpus: int  # GPUs reserved in all (0: whole nodes)
    partition: str  # PartitionName
    users: list[str]  # Users=
    accounts: list[str]  # Accounts=
    flags: list[str]  # Flags=
    active: bool  # State=ACTIVE (the window has begun) or INACTIVE


class ReservationsReply(msgspec.Struct, frozen=True, tag="reservations_reply", kw_only=True):
    """Reservations, by name."""

    reservations: list[ReservationInfo]  # matches


# --- update_node (scontrol update NodeName=) ----------------------------------------------------------

#: What ``scontrol update NodeName= State=`` may set (UNDRAIN is sent as RESUME).
NodeStateChange = Literal["DRAIN", "RESUME", "DOWN"]


class NodeUpdateRequest(msgspec.Struct, frozen=True, tag="update_node", kw_only=True):
    """scontrol update NodeName=LIST State=DRAIN|DOWN Reason=... | State=RESUME (admins only).

    The gateway appends one intent per node and waits (bounded) for health's ``NodeDrained``,
    ``NodeDown`` or ``NodeResumed`` of each, so that a job submitted after the reply never starts on a
    drained or downed node.
    """

    nodes: list[str]  # the nodes (expanded hostlist), at least one
    state: NodeStateChange  # DRAIN, DOWN or RESUME
    reason: str = ""  # Reason=: required for DRAIN and DOWN


class NodeUpdateReply(msgspec.Struct, frozen=True, tag="node_update_reply", kw_only=True):
    """Every node of the request is drained (or resumed)."""

    nodes: list[str]  # the nodes, as requested


Request = (
    SubmitRequest
    | WillRunRequest
    | CancelRequest
    | JobsRequest
    | NodesRequest
    | AcctRequest
    | HoldRequest
    | ReleaseRequest
    | UpdateRequest
    | RequeueRequest
    | SignalRequest
    | PriorityRequest
    | SharesRequest
    | CreateReservationRequest
    | DeleteReservationRequest
    | ReservationsRequest
    | NodeUpdateRequest
)
