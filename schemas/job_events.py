"""The events of jobs (on ``corral.evt.job.<id>.<tag>``): the gateway's intents and the scheduler's decisions
and conclusions, with the typed reasons they carry. Run and step facts are in ``run_events.py``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.schemas.ids import JobId, NodeName
from corral.schemas.job_spec import JobSpec

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

#: Why a pending job waits (Slurm's reason codes, squeue's REASON column); ``libs/core/reasons.py`` says which
#: step of the cycle gives each.
PendingReason = Literal[
    "JobHeldUser",
    "JobHeldAdmin",
    "DependencyNeverSatisfied",
    "Dependency",
    "BeginTime",
    "JobArrayTaskLimit",
    "InvalidQOS",
    "QOSMaxGRESPerUser",
    "QOSMaxJobsPerUserLimit",
    "QOSGrpGRES",
    "AssocMaxJobsLimit",
    "AssocGrpGRES",
    "AssocGrpJobsLimit",
    "ReqNodeNotAvail",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "Resources",
    "Priority",
    "Reservation",
    "ReservationDeleted",
]

#: The longest detail a pending reason carries (a hostlist of unavailable nodes is cut to it).
MAX_REASON_DETAIL = 256

#: What of a run a signal request (scancel -s) reaches, as in Slurm: ``steps`` = the tasks of the job's
#: steps on every node (the default; not the batch shell nor what it started without srun), ``batch`` = the
#: batch shell only (``-b``), ``full`` = the batch shell, every process it started and the steps (``-f``).
SignalScope = Literal["steps", "batch", "full"]


class JobSubmitted(msgspec.Struct, frozen=True, tag="job_submitted", kw_only=True):
    """Intent (gateway): a user submitted a job; the job is PENDING from here.

    With ``spec.array`` it is a whole job array, accepted atomically in this one entry: the fold expands it
    into one PENDING job per index, with the ids ``job_id, job_id + 1, ...`` in index order (a block the
    gateway reserved on the id counter). Only the first task's events share this entry's subject.
    """

    job_id: JobId  # monotonic, never reused; an array's first id (the array's id)
    user: str  # the job's owner: the authenticated submitter, or the user a service account submitted for
    spec: JobSpec  # what was asked for
    # The service account that submitted it on ``user``'s behalf (its scope allowed that user or account;
    # ``docs/security.md``); "" = ``user`` submitted it. The actor of the entry when set.
    service_account: str = ""


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


class JobCompleted(msgspec.Struct, frozen=True, tag="job_completed", kw_only=True):
    """Conclusion (scheduler): the run ended with exit code 0; state COMPLETED."""

    job_id: JobId  # the job
    attempt: int  # the run that completed
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class JobFailed(msgspec.Struct, frozen=True, tag="job_failed", kw_only=True):
    """Conclusion (scheduler): the job ended unsuccessfully; state FAILED (or NODE_FAIL/OOM)."""

    job_id: JobId  # the job
    attempt: int  # the run, -1 if the job never ran
    reason: EndReason  # why
    exit_code: int = 0  # exit code of the batch script
    signal: int = 0  # terminating signal, 0 if none
    message: str = ""  # human detail (e.g. the launch error), never parsed
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class JobCancelled(msgspec.Struct, frozen=True, tag="job_cancelled", kw_only=True):
    """Conclusion (scheduler): the job was cancelled; state CANCELLED."""

    job_id: JobId  # the job
    attempt: int  # the run that was killed, -1 if the job was pending
    by: str  # who cancelled it (CANCELLED by <user>)
    signal: int = 15  # the signal that ended it (ExitCode 0:15)
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class JobRequeued(msgspec.Struct, frozen=True, tag="job_requeued", kw_only=True):
    """Decision (scheduler): the run ended and the job goes back to PENDING, restart count + 1."""

    job_id: JobId  # the job
    attempt: int  # the run that ended
    reason: RequeueReason  # why
    hold: bool = False  # requeued held (scontrol requeuehold): PENDING with JobHeldUser until released
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


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
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class JobReleased(msgspec.Struct, frozen=True, tag="job_released", kw_only=True):
    """Decision (scheduler): a held job is released and may be scheduled again."""

    job_id: JobId  # the job
    by: str  # who released it
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


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
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


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


class JobReasonChanged(msgspec.Struct, frozen=True, tag="job_reason_changed", kw_only=True):
    """Decision (scheduler): a pending job's reason to wait changed (squeue's REASON column).

    A record, not a move: the job stays PENDING. The scheduler appends it only when the cycle's reason (and
    detail) for the job differs from the last one logged for the same attempt, at most once per job and
    cycle (``libs/core/reason_log.py``); the fold only remembers it, so a replayed scheduler logs no
    unchanged reason again. The trace shows it as a ``pending_reason`` event of the queued span.
    """

    job_id: JobId  # the job
    attempt: int  # the run it waits for (its restart count)
    reason: PendingReason  # why it waits now
    detail: str = ""  # what squeue prints after the reason (ReqNodeNotAvail's nodes), <= MAX_REASON_DETAIL
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)
