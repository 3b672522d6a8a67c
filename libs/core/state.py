"""The scheduler's state: what the fold (``fold.py``) builds from the log and ``plan()`` decides from.

``apply(state, seq, envelope)`` is deterministic: no IO, no clock (times come from the events),
no randomness, so replaying the log rebuilds exactly the live state (``encode_state`` gives the
bytes to compare). The fold is also the guard of the invariants: a decision that would give a
GPU index to two runs, start a held job, or that names a stale attempt or a stale leader epoch,
changes nothing. Hold, release and update requests (intents) only count for a pending job.

Job arrays: one ``JobSubmitted`` with ``spec.array`` becomes one PENDING job per index, with the ids
``A, A + 1, ...`` in index order (``A`` = the submission's job id = the array's id); a submission whose
block of ids is not wholly free, or whose array is out of bounds, changes nothing. Each task is a job like
any other, except that an allocation which would run more tasks of its array at once than the array's
``%P`` throttle changes nothing, and a cancel request for the whole array (``whole_array``) marks every
live task. ``Job.last_seq`` is the sequence of the newest entry *on the job's own subject*
(``corral.evt.job.<id>.>``), what the scheduler's optimistic concurrency compares with: an array's
submission and whole-array cancel are on the first task's subject only, so the other tasks start at 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from corral.libs.core.fair_share import TresWeights, Usage
from corral.libs.slurm.array import array_indices
from corral.schemas import events as ev
from corral.schemas.job_spec import ReadOnlyDict
from corral.schemas.lifecycle import JobState
from corral.schemas.slim import SlimJobSpec


class RunExit(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How the batch script of the current run ended, as its node reported it."""

    exit_code: int  # exit status
    signal: int  # terminating signal
    oom: bool  # OOM-killed
    timed_out: bool  # killed at the time limit
    launch_error: str | None  # could not start
    killed: bool = False  # the agent killed it without being asked to (e.g. it lost track of it)


class HoldControl(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A hold or release request the scheduler has not answered yet (the newest one wins)."""

    release: bool  # True: release; False: hold
    user: str  # who asked
    admin: bool = False  # asked with admin rights


class SpecChange(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Changes to a pending job's spec the scheduler has not answered yet (requests merged, newest wins)."""

    user: str  # who asked last
    time_limit_s: int | None = None  # new TimeLimit; None = unchanged
    partition: str | None = None  # new partition; None = unchanged
    priority: int | None = None  # new admin-set priority; None = unchanged


class Preemption(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The current run of a job is being preempted (``JobPreempted``): killed, then concluded by ``mode``."""

    mode: ev.PreemptMode  # requeue: PENDING again once the run ended; cancel: PREEMPTED
    grace_s: float  # GraceTime granted between SIGTERM and SIGKILL (0: KillWait)
    at: float  # when it was decided (the run's resources are expected back at ``at + grace_s``)
    by_job: int  # the pending job it makes room for


class PendingSignal(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A signal request for the current run (``scancel -s``); the scheduler sends it as a ``SignalOrder``."""

    request_id: str  # the request's id (the order's message id)
    signal: int  # the signal number
    scope: ev.SignalScope = "steps"  # steps | batch (scancel -b) | full (scancel -f)


class LoggedReason(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The pending reason last logged for a job (``JobReasonChanged``), what the next change compares with."""

    attempt: int  # the run the job waited for then (its restart count)
    reason: ev.PendingReason  # the reason
    detail: str = ""  # its detail (squeue's text after the reason)


#: ``Job.causes`` of a job with no cause kept but its ``queued_by``: one read-only empty mapping for all.
NO_CAUSES: Mapping[str, str] = ReadOnlyDict()
#: What a job array's task that shares its spec with the task before it is stored with in a snapshot, until
#: the decode gives it that spec (``services/scheduler/snapshot.py``); never in a folded state.
NO_SPEC = SlimJobSpec(name="", script="", workdir="/")


class Job(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One job as the scheduler knows it."""

    job_id: int  # id
    user: str  # owner
    spec: SlimJobSpec = NO_SPEC  # as submitted, without the script and the environment (``fold.slim_spec``)
    submit_time: float  # when it was submitted (from the event)
    state: JobState = "PENDING"  # PENDING | RUNNING | a terminal state (``schemas.lifecycle``)
    restart_count: int = 0  # runs before the current one = number of the next/current attempt
    partition: str = ""  # partition of the current/last run ("" while never run)
    allocations: Sequence[ev.NodeAllocation] = ()  # current run's allocation
    time_limit_s: int | None = None  # current run's limit
    start_time: float | None = None  # current run's start
    end_time: float | None = None  # when the job ended
    run_started: bool = False  # the batch node reported RunStarted for the current run
    run_exit: RunExit | None = None  # the batch node reported RunExited for the current run
    # Nodes of the current run whose agent reported the run's processes there gone (RunExited from that
    # node): their resources are free at the conclusion; the others' stay held until they report.
    exited_nodes: Sequence[str] = ()
    cancel_by: str | None = None  # a cancel was requested by this user
    exit_code: int = 0  # final batch exit code
    signal: int = 0  # final terminating signal
    end_reason: str = ""  # EndReason of a failed job, "" otherwise
    end_message: str = ""  # its detail (JobFailed.message: the launch error, naming the path), "" otherwise
    last_seq: int = 0  # stream sequence of this job's newest event (optimistic concurrency)
    traceparent: str | None = None  # W3C trace context of the job's trace (from its submission)
    held: str = ""  # "user" (JobHeldUser) or "admin" (JobHeldAdmin) while held; "" otherwise
    control: HoldControl | None = None  # an unanswered hold/release request of this pending job
    change: SpecChange | None = None  # unanswered update requests of this pending job
    array_job_id: int = 0  # the array's id (its first task's id) for an array task, 0 otherwise
    array_task_id: int | None = None  # the task's index (SLURM_ARRAY_TASK_ID), None if not an array task
    submit_seq: int = 0  # stream sequence of its JobSubmitted entry (the full spec, with the script)
    preempting: Preemption | None = None  # the current run is being preempted (JobPreempted), else None
    priority_override: int | None = None  # admin-set priority (scontrol update Priority=); None = computed
    requeue_by: str | None = None  # the user who asked to requeue the current run (scontrol requeue)
    requeue_hold: bool = False  # ... with requeuehold: held once PENDING again
    signals: Sequence[PendingSignal] = ()  # signal requests for the current run (scancel -s), in log order
    # Event id of the entry that put the job in the queue as it is (its submission, or its latest requeue,
    # release or update: what its allocation names as its cause, ``causation.py``); "" once the job ended.
    queued_by: str = ""
    # Event ids of the other entries the job's next decisions may name as their cause, by kind
    # (``causation.py``); emptied once the job ended. A pending job mostly has none: one shared read-only
    # empty mapping (``NO_CAUSES``), replaced by a new dict on every change, never changed in place.
    causes: Mapping[str, str] = NO_CAUSES
    logged_reason: LoggedReason | None = None  # the pending reason last logged for it (JobReasonChanged)


class AdminDrain(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An admin's drain of a node (``NodeDrained``), kept until ``NodeResumed``."""

    reason: str  # the admin's Reason=
    by: str  # the admin who asked
    at: float  # when it was drained (the fact's time)


class Node(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One node: inventory from registration, availability from health, usage from the runs."""

    name: str  # node name
    cpus: int  # CPUs
    mem_mb: int  # memory MiB
    gpus: int  # GPUs
    gpu_type: str | None  # GPU model
    partitions: list[str]  # partitions
    features: list[str]  # features
    up: bool = True  # responding
    reason: str = ""  # why down
    used_gpus: list[int] = []  # GPU indices held by running jobs, sorted
    alloc_cpus: int = 0  # CPUs held by running jobs
    alloc_mem_mb: int = 0  # memory held by running jobs
    jobs: list[int] = []  # running jobs on the node, in allocation order
    drain: str = ""  # why its registration drained it (GPU count mismatch); "" = not drained by it
    admin_drain: AdminDrain | None = None  # an admin's drain (survives re-registration); None = none
    admin_down: AdminDrain | None = None  # an admin's down (its agent still runs); None = not downed by one
    down_id: str = ""  # event id of the newest NodeDown (what a NODE_FAIL conclusion names as its cause)


class Orphan(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A run the scheduler has concluded while its script may still be running on a node."""

    job_id: int  # job
    attempt: int  # the old run
    node: str  # where it may be running
    gpus: list[int] = []  # GPU indices it still holds there until it is seen to exit
    cpus: int = 0  # CPUs it still holds
    mem_mb: int = 0  # memory it still holds
    cause: str = ""  # event id of the run's JobAllocated (the cause of its node's RunExited)


class UsagePolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How the fold bills finished runs for fair share (a parameter of the fold, kept in the state so
    that a snapshot taken under another policy is recognised and replaced by a full replay)."""

    half_life_s: float = 7 * 86400.0  # PriorityDecayHalfLife
    weights: TresWeights = TresWeights(cpu=0.0, gpu=1.0)  # usage in GPU-seconds by default


class State(msgspec.Struct, kw_only=True, dict=True):
    """Everything the scheduler decides from. (``dict``: a consumer's journal of what the fold changed rides
    on the object without being part of it: ``changes.py``.)"""

    jobs: dict[int, Job] = {}  # every job ever submitted, by id
    active: dict[int, bool] = {}  # ids of the jobs that are PENDING or RUNNING, in submit order
    nodes: dict[str, Node] = {}  # every registered node, by name
    orphans: list[Orphan] = []  # concluded runs still to be killed
    epoch: int = 0  # highest leader epoch seen in a decision
    last_seq: int = 0  # stream sequence of the last applied entry
    now: float = 0.0  # occurred_at of the last applied entry (the log's clock)
    usage: Usage = msgspec.field(default_factory=Usage)  # fair-share usage by association, decayed
    usage_policy: UsagePolicy = UsagePolicy()  # how runs are billed (a parameter of the fold)
    array_running: dict[int, int] = {}  # RUNNING tasks of each job array with any, by the array's id
    reservations: dict[str, ev.ReservationCreated] = {}  # advance reservations not deleted nor over, by name
    resv_requests: dict[
        str, ev.ReservationCreateRequested | ev.ReservationDeleteRequested
    ] = {}  # unanswered reservation requests (the newest per name)
    resv_seqs: dict[str, int] = {}  # stream sequence of each reservation name's newest entry (concurrency)
    resv_causes: dict[str, str] = {}  # event id of each reservation name's newest request (``causation.py``)
    early_drains: dict[str, AdminDrain] = {}  # admin drains of nodes not registered yet, by node name
    skipped: int = 0  # entries skipped: a fold handler raised on them, or they had no event (``fold.skip``)
    # Ended jobs forgotten once this old by the log's clock (Slurm's MinJobAge; 0: kept): a parameter of the
    # fold, kept here like usage_policy. The rest is ``retention.py``'s: the ended jobs in end order (end
    # time, id) from ``ended_from`` on; the live jobs' dependency targets and live tasks per array, counted;
    # the ended jobs kept while still needed, by the count they wait for; the ids forgotten, as sorted
    # ranges [start, end) flattened.
    min_job_age_s: float = 0.0
    ended: list[tuple[float, int]] = []
    ended_from: int = 0
    depended: dict[int, int] = {}
    array_live: dict[int, int] = {}
    parked: dict[int, list[int]] = {}
    forgotten: list[int] = []


# Insertion order is the log order, so equal folds give equal bytes without sorting.
_state_encoder = msgspec.json.Encoder()


def encode_state(state: State) -> bytes:
    """Canonical bytes of a state: equal states encode identically."""
    return _state_encoder.encode(state)


def decode_state(data: bytes) -> State:
    """Inverse of encode_state (tests and tools compare states by it). A job without its spec is refused:
    ``Job.spec``'s default is only the scheduler's snapshot's mark (``NO_SPEC``)."""
    state = msgspec.json.decode(data, type=State)
    for job in state.jobs.values():
        if job.spec is NO_SPEC:
            raise msgspec.ValidationError(f"job {job.job_id} has no spec")
    return state


def drained(node: Node) -> bool:
    """True if no new job may be placed on the node: an admin or its registration drained it."""
    return bool(node.drain) or node.admin_drain is not None


def drain_reason(node: Node) -> str:
    """Why the node is drained (the admin's reason first), "" if it is not."""
    return node.admin_drain.reason if node.admin_drain is not None else node.drain


def array_tasks(state: State, array_job_id: int) -> list[Job]:
    """Every task of the array whose id is ``array_job_id``, in index order; [] if it is not an array."""
    head = state.jobs.get(array_job_id)
    if head is None or head.array_job_id != array_job_id or head.spec.array is None:
        return []
    tasks = []
    for job_id in range(array_job_id, array_job_id + len(array_indices(head.spec.array))):
        task = state.jobs.get(job_id)
        if task is not None and task.array_job_id == array_job_id:
            tasks.append(task)
    return tasks


def is_array(job: Job) -> bool:
    """True if ``job``'s id is also its array's id (the first task), so that the id names the whole array."""
    return job.array_job_id == job.job_id


def array_throttle(job: Job) -> int:
    """The ``%P`` limit of running tasks of the job's array; 0 if none (or not an array task)."""
    array = job.spec.array
    return array.throttle if array is not None and job.array_job_id else 0
