"""Which log events a job's spans are made of (``derive.py``), and why the others are not: every event type
is in exactly one of ``HANDLED`` and ``IGNORED`` (``tests/unit/test_trace_derive.py`` checks it), so a new
event type must be placed here before the derivation can be called complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.schemas import events as ev
from corral.schemas import lifecycle
from corral.schemas.lifecycle import JobState

#: Event types the derivation does not turn into span data, and why.
IGNORED: dict[type[ev.Event], str] = {
    ev.JobHoldRequested: "an intent: the JobHeld decision is the pending reason's change",
    ev.JobReleaseRequested: "an intent: JobReleased is the change",
    ev.JobUpdateRequested: "an intent: JobUpdated is the change",
    ev.NodeUp: "node facts count only as causes (NodeDown)",
    ev.NodeDrained: "a drain ends no run",
    ev.NodeResumed: "a drain ends no run",
    ev.NodeHealthReported: "node facts count only as causes (its NodeDrained's requeue names the drain)",
    ev.NodeDrainRequested: "an intent",
    ev.NodeResumeRequested: "an intent",
    ev.NodeDownRequested: "an intent: health's NodeDown is the fact",
    ev.ReservationCreateRequested: "not about a job",
    ev.ReservationDeleteRequested: "not about a job",
    ev.ReservationCreated: "not about a job",
    ev.ReservationRejected: "not about a job",
    ev.ReservationDeleted: "not about a job",
}

CONCLUSIONS = (ev.JobCompleted, ev.JobFailed, ev.JobCancelled)

#: Event types that become span data: spans' starts and ends, span events, causes.
HANDLED: frozenset[type[ev.Event]] = frozenset(
    {
        ev.JobSubmitted,
        ev.JobAllocated,
        ev.RunStarted,
        ev.RunExited,
        ev.StepStarted,
        ev.StepExited,
        ev.NodeDown,
        ev.NodeRegistered,
        ev.JobRequeued,
        *CONCLUSIONS,
        ev.JobHeld,
        ev.JobReleased,
        ev.JobUpdated,
        ev.JobReasonChanged,
        ev.JobCancelRequested,
        ev.JobPreempted,
        ev.JobRequeueRequested,
        ev.JobSignalRequested,
    }
)


def counts(
    body: ev.Event,
    job_id: int,
    array_id: int,
    state: JobState,
    attempt: int,
    nodes: Sequence[ev.NodeAllocation],
) -> bool:
    """Whether ``body`` is about job ``job_id`` (submitted as ``array_id``) in its ``state`` and current
    ``attempt`` on ``nodes``: the lifecycle's rule (``schemas.lifecycle``), as the fold applies it."""
    if isinstance(body, ev.NodeDown):
        return state == "RUNNING" and any(a.node == body.node for a in nodes)
    if isinstance(body, ev.StepStarted | ev.StepExited):
        return body.job_id == job_id and state == "RUNNING" and body.attempt == attempt
    if type(body) in IGNORED:
        return False
    about = getattr(body, "job_id", None)
    whole = isinstance(body, ev.JobCancelRequested) and body.whole_array
    if about != job_id and not (whole and about == array_id):
        return False
    transition = lifecycle.JOB_TRANSITION_OF.get(type(body))
    if transition is not None:
        given = getattr(body, "attempt", None)
        current = given == attempt or (
            transition.attempt == "current_or_pending" and given == -1 and state == "PENDING"
        )
        return state in transition.sources and current
    mark = lifecycle.JOB_MARK_OF[type(body)]
    return state in mark.states and getattr(body, "attempt", attempt) == attempt
