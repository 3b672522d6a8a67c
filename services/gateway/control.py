"""Checks of hold, release and update requests before their intent is appended (pure), and who may control a
job (``may_control``: its owner, an admin, or a coordinator of its account or of an account above it).

The gateway holds no job state: it reads the job's newest log entry and refuses what Slurm refuses
(a job that runs or ended cannot be held, released or changed). The check is a courtesy, not the guard: the
job may start between the check and the append, and the scheduler's fold, which ignores a hold or
release request of a job that is not pending, decides.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.libs.config.cluster import ClusterConfig
from corral.schemas import events as ev

#: Slurm's wording for each refusal (printed as ``scontrol: error: <text> for job <id>``).
INVALID_JOB = "Invalid job id specified"
DENIED = "Access/permission denied"
NOT_PENDING = "Job is no longer pending execution"
ALREADY_DONE = "Job/step already completing or completed"
PENDING = "Job is pending execution"
REQUEUE_DISABLED = "Requested operation is presently disabled"
ARRAY_UPDATE = "Updating a whole job array is not supported by Corral yet: update its tasks by their job ids"

#: Where a job is, as its newest entry on its subjects shows: pending, running, running but ending (its run
#: exited or is being killed for a preemption), being cancelled (pending or running), or ended.
Phase = Literal["pending", "running", "ending", "cancelling", "ended"]

#: The phase of a job whose newest entry is of this type (an intent the fold may still ignore counts as
#: what it asks for: the check is a courtesy).
PHASE_AFTER: dict[type, Phase] = {
    ev.JobSubmitted: "pending",
    ev.JobRequeued: "pending",
    ev.JobHoldRequested: "pending",
    ev.JobReleaseRequested: "pending",
    ev.JobHeld: "pending",
    ev.JobReleased: "pending",
    ev.JobUpdateRequested: "pending",
    ev.JobUpdated: "pending",
    ev.JobReasonChanged: "pending",
    ev.JobAllocated: "running",
    ev.RunStarted: "running",
    ev.JobRequeueRequested: "running",
    ev.JobSignalRequested: "running",
    ev.RunExited: "ending",
    ev.JobPreempted: "ending",
    ev.JobCancelRequested: "cancelling",
    ev.JobCompleted: "ended",
    ev.JobFailed: "ended",
    ev.JobCancelled: "ended",
}

#: The event types that are never a job's newest entry: they are not on a job's subjects.
NOT_ON_JOB_SUBJECTS: dict[type, str] = {
    **dict.fromkeys(ev.NODE_EVENTS, "on the node's subjects"),
    **dict.fromkeys(ev.RESERVATION_EVENTS, "on the reservation's subjects"),
    ev.StepStarted: "on the job's step subjects, which the newest-entry lookup does not cover",
    ev.StepExited: "on the job's step subjects, which the newest-entry lookup does not cover",
}


def may_control(user: str, submitted: ev.JobSubmitted, config: ClusterConfig, admins: frozenset[str]) -> bool:
    """Whether ``user`` may cancel, signal, hold, release, requeue or update the job ``submitted`` made: its
    owner, an admin (``--admin`` or ``[cluster] admins``), or a coordinator of the job's account (or of an
    account above it: ``[[accounts]] coordinators``), as Slurm lets an account coordinator manage its users'
    jobs. Raising a time limit or setting a priority stays the admins' (``Gateway._update_one``)."""
    account = submitted.spec.account or config.default_account(submitted.user)
    return user == submitted.user or user in admins or config.coordinates(user, account)


def phase(latest: ev.Event | None) -> Phase:
    """The phase of a job whose newest entry is ``latest`` (None: no entry yet, as good as pending)."""
    return "pending" if latest is None else PHASE_AFTER[type(latest)]


def phase_problem(latest: ev.Event | None) -> str | None:
    """Why a job whose newest event is ``latest`` cannot be held or released, or None if it may be."""
    now = phase(latest)
    if now == "ended":
        return ALREADY_DONE
    if now in ("running", "ending"):
        return NOT_PENDING
    return None


def run_problem(latest: ev.Event | None) -> str | None:
    """Why a job whose newest event is ``latest`` has no live run to requeue or signal (Slurm's wording),
    or None if it has one. A run that exited, or is being cancelled or preempted, is ending already."""
    now = phase(latest)
    if now == "running":
        return None
    if now in ("ended", "ending", "cancelling"):
        return ALREADY_DONE
    return PENDING


def admin_hold(held: tuple[int, ev.Event] | None, released: tuple[int, ev.Event] | None) -> bool:
    """Whether the job is under an admin hold, from its newest ``JobHeld`` and ``JobReleased`` entries."""
    if held is None or not isinstance(held[1], ev.JobHeld) or not held[1].admin:
        return False
    return released is None or released[0] < held[0]


def current_spec(submitted: ev.JobSpec, updated: tuple[int, ev.Event] | None) -> ev.JobSpec:
    """A job's spec now: as submitted, with the time limit and partition of its newest ``JobUpdated``."""
    if updated is None or not isinstance(updated[1], ev.JobUpdated):
        return submitted
    change = updated[1]
    return msgspec.structs.replace(submitted, time_limit_s=change.time_limit_s, partition=change.partition)
