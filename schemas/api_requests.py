"""The API's requests (``corral.api.v1.<verb>.<user>``): one tagged Struct per verb, and their union.

The caller's identity is never in a request body: it is the last token of the subject.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from corral.schemas.api_report import ReportRequest
from corral.schemas.job_events import SignalScope
from corral.schemas.job_spec import JobSpec
from corral.schemas.node_events import MAX_NODE_REASON

# Bounds the gateway enforces, stated once (``msgspec.Meta``: the decoder and the JSON Schema carry them).

#: Longest submit token.
MAX_TOKEN = 128
#: The highest signal number (SIGRTMAX on Linux).
MAX_SIGNAL = 64
#: The highest priority an admin may set (Slurm's priorities are 32-bit; 0xfffffffe is NO_VAL).
MAX_PRIORITY = 0xFFFFFFFD
#: The most jobs one control request may name (ids and array tasks together; the schema bounds each list).
MAX_CANCEL = 10_000
#: A list of job ids of a control request.
JobIds = Annotated[list[int], msgspec.Meta(max_length=MAX_CANCEL)]
#: The most jobs one submit_batch request may carry (the whole message is bounded too, as every API message:
#: 4 MiB, ``codec.MAX_MESSAGE_BYTES``).
MAX_BATCH = 1000

# --- submit (sbatch, sbatch --test-only) ----------------------------------------------------------------


class SubmitRequest(msgspec.Struct, frozen=True, tag="submit", kw_only=True):
    """sbatch: submit one batch job."""

    token: Annotated[
        str, msgspec.Meta(min_length=1, max_length=MAX_TOKEN)
    ]  # client-chosen idempotency token: a retry with the same token gets the same job id
    spec: JobSpec  # the job
    test_only: bool = (
        False  # sbatch --test-only: validate and estimate the start (WillRunReply), append nothing
    )
    # A service account's submission for this user (sbatch: CORRAL_ON_BEHALF_OF); the gateway accepts it
    # only when the caller is a service account whose scope covers the user or the account.
    on_behalf_of: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None


class SubmitBatchRequest(msgspec.Struct, frozen=True, tag="submit_batch", kw_only=True):
    """Many jobs in one request (a CI system, a sweep tool): each is a submit request of its own, with its own
    token and its own result, accepted or refused as ``submit`` would (``test_only`` is refused here)."""

    jobs: Annotated[list[SubmitRequest], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]  # in order


class WillRunRequest(msgspec.Struct, frozen=True, tag="will_run", kw_only=True):
    """The gateway -> the scheduler, for ``sbatch --test-only``: when would this validated job start?"""

    user: str  # who would submit it
    spec: JobSpec  # the job, as the gateway would append it (partition, account and QOS resolved)


# --- cancel (scancel) -----------------------------------------------------------------------------------


class ArrayTasks(msgspec.Struct, frozen=True, kw_only=True):
    """Some tasks of a job array, by index: ``A_T`` or ``A_[1-3,7]``."""

    array_job_id: int  # the array's id (its first task's job id)
    task_ids: list[int]  # the tasks' indices (SLURM_ARRAY_TASK_ID)


class CancelRequest(msgspec.Struct, frozen=True, tag="cancel", kw_only=True):
    """scancel: cancel jobs. An array's id (``scancel A``) cancels every task of the array."""

    job_ids: JobIds  # jobs to cancel
    tasks: list[ArrayTasks] = []  # array tasks to cancel by index (``scancel A_T``, ``A_[1-3]``)


# --- hold / release / update / requeue / signal (scontrol, scancel -s) ----------------------------------


class HoldRequest(msgspec.Struct, frozen=True, tag="hold", kw_only=True):
    """scontrol hold: keep pending jobs from starting (JobHeldUser; JobHeldAdmin when an admin asks)."""

    job_ids: JobIds  # jobs to hold (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to hold by index


class ReleaseRequest(msgspec.Struct, frozen=True, tag="release", kw_only=True):
    """scontrol release: let held jobs be scheduled again."""

    job_ids: JobIds  # jobs to release (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to release by index


class UpdateRequest(msgspec.Struct, frozen=True, tag="update", kw_only=True):
    """scontrol update JobId=...: change a pending job (TimeLimit, Partition); None leaves a field as is.

    A user may only lower a time limit; an admin may also raise it (as in Slurm).
    """

    job_id: int  # the job
    time_limit_s: int | None = None  # new TimeLimit in seconds
    partition: str | None = None  # new Partition
    priority: Annotated[int, msgspec.Meta(ge=0, le=MAX_PRIORITY)] | None = (
        None  # new absolute Priority (admin only); 0 holds the job (JobHeldAdmin)
    )


class RequeueRequest(msgspec.Struct, frozen=True, tag="requeue", kw_only=True):
    """scontrol requeue[hold]: kill running jobs and put them back in the queue under the same id."""

    job_ids: list[int]  # jobs to requeue (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to requeue by index
    hold: bool = False  # requeuehold: held once pending again (a pending job is just held)


class SignalRequest(msgspec.Struct, frozen=True, tag="signal", kw_only=True):
    """scancel -s SIG (a signal that does not cancel): signal running jobs without ending them."""

    job_ids: JobIds  # jobs to signal (an array's id: every task)
    tasks: list[ArrayTasks] = []  # array tasks to signal by index
    signal: Annotated[int, msgspec.Meta(ge=1, le=MAX_SIGNAL)]  # signal number, 1-64
    scope: SignalScope = "steps"  # steps (default) | batch (scancel -b) | full (scancel -f)


# --- queries (squeue, sprio, sshare, sinfo, sacct) ------------------------------------------------------


class JobsRequest(msgspec.Struct, frozen=True, tag="jobs", kw_only=True):
    """squeue: the live queue (pending and running jobs), filtered."""

    job_ids: list[int] = []  # only these jobs (empty: all); an array's id selects all its tasks
    users: list[str] = []  # only these users
    partitions: list[str] = []  # only these partitions
    states: list[str] = []  # only these states
    include_finished: bool = False  # also jobs that ended recently (squeue -j of a finished job)
    after_job_id: int = 0  # only jobs with a larger id: the next page, after the last job of the one before
    # The pending tasks of an array that never ran and would show alike as one row (``JobInfo.array_tasks``):
    # squeue without -r, -j or -S -i, which shows them as one A_[x-y] row anyway.
    collapse_arrays: bool = False


class LiveCountsRequest(msgspec.Struct, frozen=True, tag="live_counts", kw_only=True):
    """The gateway's MaxSubmitJobs check at a submission: how many pending and running jobs ``user`` has, by
    QOS and account (a few numbers, where the user's jobs themselves are thousands)."""

    user: str  # whose jobs


class PriorityRequest(msgspec.Struct, frozen=True, tag="priority", kw_only=True):
    """sprio: the priority factors of pending jobs."""

    job_ids: list[int] = []  # only these jobs (empty: all pending); an array's id selects its tasks
    users: list[str] = []  # only these users
    after_job_id: int = 0  # only jobs with a larger id: the next page, after the last job of the one before


class SharesRequest(msgspec.Struct, frozen=True, tag="shares", kw_only=True):
    """sshare: the fair-share tree with usage and factors."""

    users: list[str] = []  # only these users' associations (and the accounts above them)
    accounts: list[str] = []  # only these accounts and what is beneath them
    all_users: bool = False  # -a: every user association (default: only the caller's)
    start: int = 0  # the first row wanted: the next page starts after the rows of those before


class NodesRequest(msgspec.Struct, frozen=True, tag="nodes", kw_only=True):
    """sinfo: nodes and partitions."""

    partitions: list[str] = []  # only nodes of these partitions
    after_node: str = ""  # only nodes whose names sort after this one: the next page


class AcctRequest(msgspec.Struct, frozen=True, tag="acct", kw_only=True):
    """sacct: accounting records from the read model."""

    job_ids: list[int] = []  # only these jobs (empty: all matching the others); an array's id: its tasks
    users: list[str] = []  # only these users (empty: all)
    accounts: list[str] = []  # only these accounts
    states: list[str] = []  # only jobs in these states
    start_after: float | None = None  # -S: jobs that were eligible/ran after this time
    end_before: float | None = None  # -E: jobs that started before this time
    limit: int = 10000  # at most this many jobs
    after_job_id: int = 0  # only jobs with a larger id: the next page, after the last job of the one before
    duplicates: bool = False  # -D: each job's earlier runs too (AcctJob.attempts)


# --- history (corral audit) ----------------------------------------------------------------------------

#: The most entries one history request may ask for.
MAX_HISTORY = 10_000


class HistoryRequest(msgspec.Struct, frozen=True, tag="history", kw_only=True):
    """corral audit: entries of the log, exactly one of ``job_id``, ``node`` and ``user`` given.

    - ``job_id``: the job's entries (``corral.evt.job.<id>.>``, its steps' facts), and for an array task
      the array's submission and its whole-array cancels; with ``array_task``, ``job_id`` is an array's id
      and the history is that of its task with this index (Slurm's ``A_T``);
    - ``node``: the node's events, and the job events that name it (allocations, its run and step facts);
    - ``user``: every event of the user's jobs.

    A user may read their own jobs' history; the auditor and admin roles may read every one.
    """

    job_id: int | None = None  # one job (an array task's own id, or an array's id: its first task)
    node: str | None = None  # one node
    user: str | None = None  # one user's jobs
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_HISTORY)] = 1000  # at most this many entries, the newest
    array_task: int | None = None  # with job_id: the task of array job_id with this index (``A_T``)


# --- reservations (scontrol create/delete/show reservation) ---------------------------------------------


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


class ReservationsRequest(msgspec.Struct, frozen=True, tag="reservations", kw_only=True):
    """scontrol show reservation [NAME]."""

    names: list[str] = []  # only these (empty: all)


class PingRequest(msgspec.Struct, frozen=True, tag="ping", kw_only=True):
    """scontrol ping: the schedulers, which one leads and which are up (any scheduler answers)."""


# --- update_node (scontrol update NodeName=) ------------------------------------------------------------


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
    reason: Annotated[str, msgspec.Meta(max_length=MAX_NODE_REASON)] = (
        ""  # Reason=: required for DRAIN and DOWN
    )


#: Every request of the API (its JSON Schema is schemas/jsonschema/api-request.json).
Request = (
    SubmitRequest
    | SubmitBatchRequest
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
    | LiveCountsRequest
    | SharesRequest
    | CreateReservationRequest
    | DeleteReservationRequest
    | ReservationsRequest
    | NodeUpdateRequest
    | HistoryRequest
    | ReportRequest
    | PingRequest
)
