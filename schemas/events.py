"""The v1 events of the log: a tagged union of frozen msgspec Structs inside one ``Envelope``.

Tags are stable forever. Fields are added only at the end, with defaults.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

#: A job id: positive, monotonic, never reused.
JobId: TypeAlias = int
#: A node name: one subject token.
NodeName: TypeAlias = str

#: Tags that were once used and must never be used again.
RETIRED_TAGS: frozenset[str] = frozenset()

OpenMode = Literal["truncate", "append"]

#: Why a job ended other than by completing (Slurm's vocabulary), typed, never free text.
EndReason = Literal[
    "NonZeroExitCode",  # the batch script exited non-zero
    "RaisedSignal",  # the batch script was killed by a signal it did not ask for
    "LaunchFailed",  # the agent could not start the script (bad workdir, unwritable output ...)
    "NodeFail",  # a node of the run went down and the job may not be requeued
    "OutOfMemory",  # the kernel's OOM killer ended the run
    "TimeLimit",  # the run reached its time limit
    "Preempted",  # the run was killed to make room for a job that may preempt it; state PREEMPTED
]

#: Why a job was put back in the queue.
RequeueReason = Literal["NodeFail", "Requested", "Preempted"]

#: What happens to a preempted job once its run has ended (Slurm's PreemptMode): ``requeue``: it is
#: PENDING again (restart count + 1); ``cancel``: it ends PREEMPTED.
PreemptMode = Literal["requeue", "cancel"]

#: What of a run a signal request (scancel -s) reaches, as in Slurm: ``steps`` = the tasks of the job's
#: steps on every node (the default; not the batch shell nor what it started without srun), ``batch`` = the
#: batch shell only (``-b``), ``full`` = the batch shell, every process it started and the steps (``-f``).
SignalScope = Literal["steps", "batch", "full"]

#: Kinds of job dependency (sbatch -d), with Slurm's meaning:
#: after = the dependee started (or ended without starting), afterok = it COMPLETED,
#: afternotok = it ended in any other terminal state, afterany = it ended,
#: singleton = no earlier job of the same name and user is pending or running.
DependencyType = Literal["after", "afterok", "afternotok", "afterany", "singleton"]


class Dependency(msgspec.Struct, frozen=True, kw_only=True):
    """One condition of a job's dependency list (``afterok:5:6`` is two of them)."""

    type: DependencyType  # the kind of condition
    job_id: JobId = 0  # the job it is about; 0 for singleton


class Dependencies(msgspec.Struct, frozen=True, kw_only=True):
    """A job's dependency list: all of it must hold (``,``) or any one item (``?``)."""

    items: list[Dependency]  # the conditions, in the order given
    any_of: bool = False  # True: one satisfied item is enough (``?``); False: all must be (``,``)


class ArrayRange(msgspec.Struct, frozen=True, kw_only=True):
    """One item of ``sbatch --array``: ``start[-end[:step]]`` (a single index has end = start)."""

    start: int  # first index
    end: int  # last index (inclusive)
    step: int = 1  # every step-th index from start


class ArraySpec(msgspec.Struct, frozen=True, kw_only=True):
    """A job array (``sbatch --array=0-999%32``): one job per index, each with its own job id.

    The task with the k-th smallest index gets the k-th id of the block the gateway reserved; the first
    id is the array's id (``SLURM_ARRAY_JOB_ID``, ``%A``). At most MaxArraySize (1001) tasks, indices
    0..1000.
    """

    ranges: list[ArrayRange]  # the items as given; the indices are their union, in ascending order
    throttle: int = 0  # ``%P``: at most this many tasks of the array run at once; 0 = no limit


class Constraint(msgspec.Struct, frozen=True, kw_only=True):
    """``--constraint``: node features a job's nodes must have (``a``, ``a&b`` all of them, ``a|b`` any)."""

    features: list[str]  # feature names, as given, at least one
    any_of: bool = False  # True: a node needs one of the features (``|``); False: all of them (``&``)


class WarnSignal(msgspec.Struct, frozen=True, kw_only=True):
    """``--signal=[B:]SIG@T``: a warning signal T seconds before the time limit, once per run."""

    signum: int  # the signal's number (10 = SIGUSR1 on Linux)
    seconds_before: int = 60  # T: seconds before the limit (Slurm's default 60)
    batch_only: bool = False  # B: only the batch shell gets it; else the tasks of the job's steps


class JobSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a user asked for: everything needed to schedule and launch a batch job.

    The script is copied at submit time; the submitter may delete the file right after.
    """

    name: str  # job name (-J); defaults to the script's file name, "sbatch" for stdin
    script: str  # the batch script's full text
    argv: list[str] = []  # arguments passed to the script
    workdir: str  # absolute submit directory; the script runs here
    environment: dict[str, str] = {}  # the submitter's environment to export (--export=ALL)
    stdout: str | None = None  # -o pattern (%j %x %u %N ...); None = slurm-%j.out in workdir
    stderr: str | None = None  # -e pattern; None = merged into stdout
    open_mode: OpenMode = "truncate"  # --open-mode for stdout/stderr
    partition: str | None = None  # -p; None = the cluster's default partition
    account: str | None = None  # -A; None = the user's default account
    nodes: int = 1  # -N: number of nodes
    ntasks: int = 1  # -n: number of tasks
    ntasks_per_node: int | None = None  # --ntasks-per-node
    cpus_per_task: int = 1  # -c
    mem_per_node_mb: int | None = None  # --mem in MiB; None = the partition default (0 = whole node)
    gpus_per_node: int = 0  # from --gres=gpu[:type]:N or --gpus-per-node
    gpu_type: str | None = None  # typed GPU request (gpu:h100:4); None = any type
    time_limit_s: int | None = None  # -t in seconds; None = the partition's default
    requeue: bool = True  # --requeue / --no-requeue: may the job be requeued on node failure
    submit_host: str = ""  # host sbatch ran on (SLURM_SUBMIT_HOST)
    dependencies: Dependencies | None = None  # -d: start only once these hold; None = no dependency
    held: bool = False  # -H: submitted held (JobHeldUser) until released
    begin_time: float | None = None  # -b: not eligible before this Unix time; None = at once
    array: ArraySpec | None = None  # -a/--array: one job per index; None = a single job
    nodelist: list[str] = []  # -w: nodes the job must include (expanded hostlist); [] = any
    exclude: list[str] = []  # -x: nodes the job must not use (expanded hostlist)
    constraint: Constraint | None = None  # -C: node features required; None = any node
    exclusive: bool = False  # --exclusive: whole nodes, all their CPUs, GPUs and memory, shared with no job
    gpus_per_task: int | None = None  # --gpus-per-task (gpus_per_node already holds tasks per node x this)
    cpus_per_gpu: int | None = None  # --cpus-per-gpu: CPUs per node = gpus_per_node x this (not with -c)
    qos: str | None = None  # -q/--qos; None = the partition's QOS, else the default QOS (resolved at submit)
    nice: int = 0  # --nice: subtracted from the priority; only an admin may give a negative value
    reservation: str | None = None  # --reservation: run only in this advance reservation; None = outside any
    switches: int | None = None  # --switches=N: at most N topology blocks; None = any number
    switches_wait_s: int | None = None  # --switches=N@T: wait at most T s for them (None: max_switch_wait)
    segment: int | None = None  # --segment=N: nodes in segments of N, each inside one block; None = no rule
    warn_signal: WarnSignal | None = None  # --signal: warning signal before the time limit; None = none
    wckey: str | None = None  # --wckey: workload characterization key, recorded with the job; None = none


class JobSubmitted(msgspec.Struct, frozen=True, tag="job_submitted", kw_only=True):
    """Intent (gateway): a user submitted a job; the job is PENDING from here.

    With ``spec.array`` it is a whole job array, accepted atomically in this one entry: the fold expands it
    into one PENDING job per index, with the ids ``job_id, job_id + 1, ...`` in index order (a block the
    gateway reserved on the id counter). Only the first task's events share this entry's subject.
    """

    job_id: JobId  # monotonic, never reused; an array's first id (the array's id)
    user: str  # authenticated submitter (taken from the connection, never from the request)
    spec: JobSpec  # what was asked for


class JobCancelRequested(msgspec.Struct, frozen=True, tag="job_cancel_requested", kw_only=True):
    """Intent (gateway): a user asked to cancel a job (scancel)."""

    job_id: JobId  # the job to cancel
    user: str  # who asked (authenticated)
    whole_array: bool = False  # job_id is an array's id: cancel every task of the array (scancel A)


class NodeAllocation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The part of a run on one node."""

    node: NodeName  # node name
    gpus: list[int] = []  # GPU indices on that node, exclusively this run's
    cpus: int = 1  # CPUs on that node
    mem_mb: int = 0  # memory on that node in MiB


class JobAllocated(msgspec.Struct, frozen=True, tag="job_allocated", kw_only=True):
    """Decision (scheduler): a run of the job gets these nodes; the job is RUNNING from here."""

    job_id: JobId  # the job
    attempt: int  # run number, from 0 (= SLURM_RESTART_COUNT)
    partition: str  # partition the job runs in
    allocations: list[NodeAllocation]  # per node, in node order; the first node runs the batch script
    time_limit_s: int | None  # effective limit of this run (None = unlimited)
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class RunStarted(msgspec.Struct, frozen=True, tag="run_started", kw_only=True):
    """Fact (agent): the batch script of a run started on this node."""

    job_id: JobId  # the job
    attempt: int  # the run
    node: NodeName  # the reporting agent's node
    pid: int  # process id of the batch shell on that node


class RunExited(msgspec.Struct, frozen=True, tag="run_exited", kw_only=True):
    """Fact (agent): the batch script of a run ended on this node (or could not start)."""

    job_id: JobId  # the job
    attempt: int  # the run
    node: NodeName  # the reporting agent's node
    exit_code: int  # 0-255; 0 when killed by a signal
    signal: int = 0  # terminating signal number, 0 if none
    oom: bool = False  # the kernel's OOM killer ended it
    launch_error: str | None = None  # set when the script could not be started (why, for the user)
    killed: bool = False  # the agent killed it on an order (cancel, requeue)
    timed_out: bool = False  # the agent killed it at its time limit


class JobCompleted(msgspec.Struct, frozen=True, tag="job_completed", kw_only=True):
    """Conclusion (scheduler): the run ended with exit code 0; state COMPLETED."""

    job_id: JobId  # the job
    attempt: int  # the run that completed


class JobFailed(msgspec.Struct, frozen=True, tag="job_failed", kw_only=True):
    """Conclusion (scheduler): the job ended unsuccessfully; state FAILED (or NODE_FAIL/OOM)."""

    job_id: JobId  # the job
    attempt: int  # the run, -1 if the job never ran
    reason: EndReason  # why
    exit_code: int = 0  # exit code of the batch script
    signal: int = 0  # terminating signal, 0 if none
    message: str = ""  # human detail (e.g. the launch error), never parsed


class JobCancelled(msgspec.Struct, frozen=True, tag="job_cancelled", kw_only=True):
    """Conclusion (scheduler): the job was cancelled; state CANCELLED."""

    job_id: JobId  # the job
    attempt: int  # the run that was killed, -1 if the job was pending
    by: str  # who cancelled it (CANCELLED by <user>)
    signal: int = 15  # the signal that ended it (ExitCode 0:15)


class JobRequeued(msgspec.Struct, frozen=True, tag="job_requeued", kw_only=True):
    """Decision (scheduler): the run ended and the job goes back to PENDING, restart count + 1."""

    job_id: JobId  # the job
    attempt: int  # the run that ended
    reason: RequeueReason  # why
    hold: bool = False  # requeued held (scontrol requeuehold): PENDING with JobHeldUser until released


class JobPreempted(msgspec.Struct, frozen=True, tag="job_preempted", kw_only=True):
    """Decision (scheduler): a running job is preempted to make room for ``by_job``.

    An order, not a conclusion: the job stays RUNNING while its agent kills the run (SIGCONT+SIGTERM,
    SIGKILL after ``grace_s``); when the run's exit is reported (or its node goes down) the scheduler
    concludes with ``JobRequeued(reason="Preempted")`` in requeue mode or ``JobFailed(reason="Preempted")``
    (state PREEMPTED) in cancel mode. A run is preempted at most once.
    """

    job_id: JobId  # the preempted job (the victim)
    attempt: int  # its run being preempted
    mode: PreemptMode  # what happens once the run ended (requeue becomes cancel for a --no-requeue job)
    grace_s: float = 0.0  # GraceTime: seconds between SIGTERM and SIGKILL; 0 = the cluster's KillWait
    by_job: JobId  # the pending job it makes room for
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class NodeRegistered(msgspec.Struct, frozen=True, tag="node_registered", kw_only=True):
    """Fact (agent): a node's inventory; the node is UP from here."""

    node: NodeName  # node name (must resolve on the cluster's machines)
    cpus: int  # CPUs
    mem_mb: int  # memory in MiB
    gpus: int = 0  # number of GPUs
    gpu_type: str | None = None  # GPU model, e.g. "h100"
    partitions: list[str] = []  # partitions the node belongs to (from the cluster config)
    features: list[str] = []  # node features for --constraint
    boot_id: str = ""  # identifies one agent process lifetime
    drain_reason: str = ""  # set: the node registers DRAINED (e.g. a GPU count mismatch); "" = usable


class NodeDown(msgspec.Struct, frozen=True, tag="node_down", kw_only=True):
    """Fact (health): the node stopped responding, or an admin downed it; its runs end (requeued or
    NODE_FAIL). An admin's down (``by`` set) leaves the node's agent running: what still runs there is
    killed through it, and the node stays down, whatever its heartbeats and registrations, until
    ``NodeResumed``."""

    node: NodeName  # the node
    reason: str  # e.g. "Not responding", or the admin's Reason= (shown by sinfo -R)
    by: str = ""  # the admin who downed it (scontrol update State=DOWN); "" = it stopped responding


class NodeUp(msgspec.Struct, frozen=True, tag="node_up", kw_only=True):
    """Fact (health): a node that was down responds again."""

    node: NodeName  # the node


class JobHoldRequested(msgspec.Struct, frozen=True, tag="job_hold_requested", kw_only=True):
    """Intent (gateway): the owner or an admin asked to hold a pending job (scontrol hold)."""

    job_id: JobId  # the job to hold
    user: str  # who asked (authenticated)
    admin: bool = False  # asked with admin rights: an admin hold (JobHeldAdmin) only an admin releases


class JobReleaseRequested(msgspec.Struct, frozen=True, tag="job_release_requested", kw_only=True):
    """Intent (gateway): the owner or an admin asked to release a held job (scontrol release)."""

    job_id: JobId  # the job to release
    user: str  # who asked (authenticated)
    admin: bool = False  # asked with admin rights (may release an admin hold)


class JobHeld(msgspec.Struct, frozen=True, tag="job_held", kw_only=True):
    """Decision (scheduler): a pending job is held; it is never started until released."""

    job_id: JobId  # the job
    by: str  # who asked for the hold
    admin: bool = False  # JobHeldAdmin (an admin hold) rather than JobHeldUser


class JobReleased(msgspec.Struct, frozen=True, tag="job_released", kw_only=True):
    """Decision (scheduler): a held job is released and may be scheduled again."""

    job_id: JobId  # the job
    by: str  # who released it


class JobUpdateRequested(msgspec.Struct, frozen=True, tag="job_update_requested", kw_only=True):
    """Intent (gateway): the owner or an admin asked to change a pending job (scontrol update)."""

    job_id: JobId  # the job to change
    user: str  # who asked (authenticated)
    admin: bool = False  # asked with admin rights
    time_limit_s: int | None = None  # new TimeLimit in seconds; None = unchanged
    partition: str | None = None  # new Partition; None = unchanged
    priority: int | None = None  # new absolute Priority (admin only; 0 = hold); None = unchanged


class JobUpdated(msgspec.Struct, frozen=True, tag="job_updated", kw_only=True):
    """Decision (scheduler): a pending job's spec changed; both fields are the values from here on."""

    job_id: JobId  # the job
    by: str  # who asked for the change
    time_limit_s: int | None  # the job's requested TimeLimit now (None = the partition's default)
    partition: str | None  # the job's partition now
    priority: int | None = None  # the admin-set priority now (None = computed; 0 = held by the admin)


class JobRequeueRequested(msgspec.Struct, frozen=True, tag="job_requeue_requested", kw_only=True):
    """Intent (gateway): the owner or an admin asked to requeue a running job (scontrol requeue[hold]).

    The scheduler has the run killed (KillOrder reason "requeue") and concludes
    ``JobRequeued(reason="Requested")`` once its exit is reported (or its node is down).
    """

    job_id: JobId  # the job to requeue
    user: str  # who asked (authenticated)
    hold: bool = False  # requeuehold: the job is held once it is PENDING again


class JobSignalRequested(msgspec.Struct, frozen=True, tag="job_signal_requested", kw_only=True):
    """Intent (gateway): the owner or an admin asked to signal a running job without ending it
    (``scancel -s SIG``); the scheduler sends a ``SignalOrder`` to the run's nodes."""

    job_id: JobId  # the job to signal
    user: str  # who asked (authenticated)
    signal: int  # the signal number
    scope: SignalScope = "steps"  # what of the run gets it: steps | batch (scancel -b) | full (-f)
    request_id: str  # unique per request (the order's message id), so two equal signals are two orders


#: Reservation flags Corral implements (Slurm's names): MAINT = maintenance (may overlap other reservations,
#: outsiders see ``ReqNodeNotAvail, Reserved for maintenance``); IGNORE_JOBS = created even if jobs run then.
ReservationFlag = Literal["MAINT", "IGNORE_JOBS"]


class ReservationCreateRequested(
    msgspec.Struct, frozen=True, tag="reservation_create_requested", kw_only=True
):
    """Intent (gateway): an admin asked for an advance reservation (scontrol create reservation).

    Exactly one of ``nodes``, ``node_count`` and ``gpu_count`` says what to reserve; the scheduler answers
    with ``ReservationCreated`` (the concrete nodes) or ``ReservationRejected``.
    """

    name: str  # ReservationName, one subject token
    user: str  # who asked (authenticated, an admin)
    start_time: float  # StartTime, Unix seconds
    end_time: float  # EndTime, Unix seconds (StartTime + Duration)
    nodes: list[str] = []  # Nodes=: these nodes, whole (expanded hostlist)
    node_count: int = 0  # NodeCnt=: this many whole nodes of the partition
    gpu_count: int = 0  # TRES=gres/gpu=N: this many GPUs of the partition (not whole nodes)
    partition: str | None = None  # PartitionName=; None = the default partition
    users: list[str] = []  # Users=: who may use it
    accounts: list[str] = []  # Accounts=: jobs of these accounts may use it
    flags: list[ReservationFlag] = []  # Flags=


class ReservationDeleteRequested(
    msgspec.Struct, frozen=True, tag="reservation_delete_requested", kw_only=True
):
    """Intent (gateway): an admin asked to delete a reservation (scontrol delete ReservationName=)."""

    name: str  # the reservation
    user: str  # who asked (authenticated, an admin)


class ReservationCreated(msgspec.Struct, frozen=True, tag="reservation_created", kw_only=True):
    """Decision (scheduler): a reservation exists over ``[start_time, end_time)`` on these nodes.

    Outsiders may not use what it holds over that window; jobs of its users/accounts that ask for it
    (``--reservation``) run only there and then. It is over once the log's clock reaches ``end_time``.
    """

    name: str  # ReservationName
    start_time: float  # StartTime
    end_time: float  # EndTime
    nodes: list[str]  # the nodes chosen, sorted
    gpus: list[int] = []  # GPUs held on each node of ``nodes`` (same order); [] = the whole nodes
    partition: str = ""  # PartitionName
    users: list[str] = []  # Users=
    accounts: list[str] = []  # Accounts=
    flags: list[ReservationFlag] = []  # Flags=
    by: str = ""  # the admin who asked


class ReservationRejected(msgspec.Struct, frozen=True, tag="reservation_rejected", kw_only=True):
    """Decision (scheduler): a reservation request cannot be carried out (Slurm's reason, for the admin)."""

    name: str  # the reservation
    reason: str  # e.g. "Requested nodes are busy"
    delete: bool = False  # the rejected request was a delete (else a create)


class ReservationDeleted(msgspec.Struct, frozen=True, tag="reservation_deleted", kw_only=True):
    """Decision (scheduler): a reservation is gone; what it held is free for everyone."""

    name: str  # the reservation
    by: str  # the admin who asked


class StepStarted(msgspec.Struct, frozen=True, tag="step_started", kw_only=True):
    """Fact (agent of the job's batch node, which coordinates the step): a step of a run started (srun).

    On ``corral.evt.step.<job>.step_started.<node>``, outside the job's subjects: step facts never move the
    job subject's last sequence that the scheduler's decisions are conditional on.
    """

    job_id: JobId  # the job
    attempt: int  # the run
    step_id: int  # the step's number, from 0 per run (``N.0``, ``N.1``)
    node: NodeName  # the reporting (batch) node
    name: str  # step name (the command's base name, or srun -J)
    nodes: list[NodeName]  # the step's nodes
    ntasks: int  # tasks over all nodes
    cpus: int = 0  # CPUs of the step's tasks (tasks x cpus per task)
    gpus: int = 0  # GPUs bound to its tasks (0 when tasks share the node's GPUs)


class StepExited(msgspec.Struct, frozen=True, tag="step_exited", kw_only=True):
    """Fact (batch node's agent): every task of a step ended; the exit of the worst task."""

    job_id: JobId  # the job
    attempt: int  # the run
    step_id: int  # the step
    node: NodeName  # the reporting (batch) node
    exit_code: int  # highest task exit code
    signal: int = 0  # a terminating signal of a task, 0 if none
    killed: bool = False  # the step was killed (Ctrl-C twice, or its run ended first)
    oom: bool = False  # a task was OOM-killed (its node's memory cgroup counted the kill)


#: Longest reason an admin may give for draining a node (Slurm keeps reasons short, one line).
MAX_NODE_REASON = 256


class NodeDrainRequested(msgspec.Struct, frozen=True, tag="node_drain_requested", kw_only=True):
    """Intent (gateway): an admin asked to drain a node (``scontrol update NodeName= State=DRAIN``).

    Health answers it with ``NodeDrained``; the scheduler folds only the fact.
    """

    node: NodeName  # the node (one per entry: a hostlist is one intent per node)
    user: str  # the admin who asked (authenticated)
    reason: str  # Reason=, required, one line of at most MAX_NODE_REASON characters


class NodeResumeRequested(msgspec.Struct, frozen=True, tag="node_resume_requested", kw_only=True):
    """Intent (gateway): an admin asked to resume a drained node (``State=RESUME`` or ``UNDRAIN``).

    Health answers it with ``NodeResumed``.
    """

    node: NodeName  # the node
    user: str  # the admin who asked (authenticated)


class NodeDownRequested(msgspec.Struct, frozen=True, tag="node_down_requested", kw_only=True):
    """Intent (gateway): an admin asked to down a node (``scontrol update NodeName= State=DOWN``).

    Health answers it with ``NodeDown(by=...)``; the scheduler folds only the fact.
    """

    node: NodeName  # the node (one per entry)
    user: str  # the admin who asked (authenticated)
    reason: str  # Reason=, required, one line of at most MAX_NODE_REASON characters


class NodeDrained(msgspec.Struct, frozen=True, tag="node_drained", kw_only=True):
    """Fact (health): the node is drained by an admin: running jobs finish, no new job is placed on it.

    Separate from a registration's ``drain_reason``: a re-registration (agent restart) keeps it; only
    ``NodeResumed`` ends it. Draining a drained node again replaces the reason.
    """

    node: NodeName  # the node
    reason: str  # the admin's Reason= (sinfo -R, scontrol show node)
    by: str  # the admin who asked (shown as ``Reason=text [by@time]``)


class NodeResumed(msgspec.Struct, frozen=True, tag="node_resumed", kw_only=True):
    """Fact (health): an admin resumed the node: its admin drain and its registration drain end.

    A registration drain (GPU count mismatch) comes back at the agent's next registration if the
    mismatch is still there, as in Slurm.
    """

    node: NodeName  # the node
    by: str  # the admin who asked


Event = (
    JobSubmitted
    | JobCancelRequested
    | JobAllocated
    | RunStarted
    | RunExited
    | JobCompleted
    | JobFailed
    | JobCancelled
    | JobRequeued
    | NodeRegistered
    | NodeDown
    | NodeUp
    | JobHoldRequested
    | JobReleaseRequested
    | JobHeld
    | JobReleased
    | JobUpdateRequested
    | JobUpdated
    | JobPreempted
    | ReservationCreateRequested
    | ReservationDeleteRequested
    | ReservationCreated
    | ReservationRejected
    | ReservationDeleted
    | JobRequeueRequested
    | JobSignalRequested
    | StepStarted
    | StepExited
    | NodeDrainRequested
    | NodeResumeRequested
    | NodeDrained
    | NodeResumed
    | NodeDownRequested
)

#: Every event class of the union, in declaration order.
EVENT_TYPES: tuple[type[Event], ...] = (
    JobSubmitted,
    JobCancelRequested,
    JobAllocated,
    RunStarted,
    RunExited,
    JobCompleted,
    JobFailed,
    JobCancelled,
    JobRequeued,
    NodeRegistered,
    NodeDown,
    NodeUp,
    JobHoldRequested,
    JobReleaseRequested,
    JobHeld,
    JobReleased,
    JobUpdateRequested,
    JobUpdated,
    JobPreempted,
    ReservationCreateRequested,
    ReservationDeleteRequested,
    ReservationCreated,
    ReservationRejected,
    ReservationDeleted,
    JobRequeueRequested,
    JobSignalRequested,
    StepStarted,
    StepExited,
    NodeDrainRequested,
    NodeResumeRequested,
    NodeDrained,
    NodeResumed,
    NodeDownRequested,
)

#: The events of nodes (on ``corral.evt.node.<node>.<tag>``).
NODE_EVENTS = (
    NodeRegistered,
    NodeDown,
    NodeUp,
    NodeDrainRequested,
    NodeResumeRequested,
    NodeDrained,
    NodeResumed,
    NodeDownRequested,
)
NodeEvent = (
    NodeRegistered
    | NodeDown
    | NodeUp
    | NodeDrainRequested
    | NodeResumeRequested
    | NodeDrained
    | NodeResumed
    | NodeDownRequested
)

#: The events of reservations (on ``corral.evt.resv.<name>.<tag>``).
RESERVATION_EVENTS = (
    ReservationCreateRequested,
    ReservationDeleteRequested,
    ReservationCreated,
    ReservationRejected,
    ReservationDeleted,
)
ReservationEvent = (
    ReservationCreateRequested
    | ReservationDeleteRequested
    | ReservationCreated
    | ReservationRejected
    | ReservationDeleted
)


class Meta(msgspec.Struct, frozen=True, kw_only=True):
    """Envelope metadata, identical for every event type."""

    event_id: str  # unique id (UUID4 hex); also the Nats-Msg-Id unless a submit token is used
    occurred_at: float  # when it happened: seconds since the Unix epoch, UTC
    actor: str  # authenticated identity of the writer (service role or user)
    correlation_id: str | None = None  # the request or job this belongs to
    causation_id: str | None = None  # the event that caused this one
    traceparent: str | None = None  # W3C trace context of the job's trace
    version: int = 1  # envelope version


class Envelope(msgspec.Struct, frozen=True):
    """One entry of the log."""

    meta: Meta  # who, when, why
    body: Event  # what
