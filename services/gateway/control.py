"""Checks of hold, release and update requests before their intent is appended (pure).

The gateway holds no job state: it reads the job's newest log entry and refuses what Slurm refuses
(a job that runs or ended cannot be held, released or changed). The check is a courtesy, not the guard: the
job may start between the check and the append, and the scheduler's fold, which ignores a hold or
release request of a job that is not pending, decides.
"""

from __future__ import annotations

import msgspec

from corral.schemas import events as ev

#: Slurm's wording for each refusal (printed as ``scontrol: error: <text> for job <id>``).
INVALID_JOB = "Invalid job id specified"
DENIED = "Access/permission denied"
NOT_PENDING = "Job is no longer pending execution"
ALREADY_DONE = "Job/step already completing or completed"
PENDING = "Job is pending execution"
REQUEUE_DISABLED = "Requested operation is presently disabled"
ARRAY_UPDATE = "Updating a whole job array is not supported by Corral yet: update its tasks by their job ids"

_ENDED = (ev.JobCompleted, ev.JobFailed, ev.JobCancelled)
_RUNNING = (
    ev.JobAllocated,
    ev.RunStarted,
    ev.RunExited,
    ev.JobRequeueRequested,
    ev.JobSignalRequested,
    ev.JobPreempted,
)


def phase_problem(latest: ev.Event | None) -> str | None:
    """Why a job whose newest event is ``latest`` cannot be held or released, or None if it may be."""
    if isinstance(latest, _ENDED):
        return ALREADY_DONE
    if isinstance(latest, _RUNNING):
        return NOT_PENDING
    return None


#: Newest entries of a job whose run is live (the intents that leave it running included).
_LIVE = (ev.JobAllocated, ev.RunStarted, ev.JobRequeueRequested, ev.JobSignalRequested)


def run_problem(latest: ev.Event | None) -> str | None:
    """Why a job whose newest event is ``latest`` has no live run to requeue or signal (Slurm's wording),
    or None if it has one. A run that exited, or is being cancelled or preempted, is ending already."""
    if isinstance(latest, _LIVE):
        return None
    if isinstance(latest, (*_ENDED, ev.RunExited, ev.JobCancelRequested, ev.JobPreempted)):
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
