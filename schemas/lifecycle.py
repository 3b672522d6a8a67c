"""The job and node state machines as data: their states, their transitions, and which event moves which.

The package docstring (``corral.schemas``) draws both machines; this module is the same picture as
tables that the consumers of the log are tested against:

- ``JOB_TRANSITIONS``: the events that move a job from one state to another (the fold applies them
  only from a listed source state, and for the job's current attempt);
- ``JOB_MARKS``: the events that change something of a job without moving its state (a cancel request,
  a hold, a run fact), with the states in which they count;
- ``NODE_TRANSITIONS``: the same for a node's two axes, availability (``UP``/``DOWN``) and drain;
- ``WRITERS``: who appends each event (one writer per kind of event keeps the replay deterministic);
- ``MACHINE``: which machine each event belongs to (job, node, reservation, or step: steps are facts for
  accounting that no state machine here folds).

Every event type is in ``WRITERS`` and ``MACHINE``, and every job event is either a transition or a mark
(``tests/unit/test_lifecycle.py``), so a new event type cannot be added without saying what it does.
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from corral.schemas import events as ev

#: A job's state as the scheduler's fold keeps it (``squeue``/``sacct`` show these; sacct's batch step also
#: shows ``REQUEUED``, see ``api.JobState``).
JobState = Literal[
    "PENDING",
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
]

#: Every job state, in declaration order.
JOB_STATES: tuple[JobState, ...] = get_args(JobState)

#: The states of a job that is still in the queue or running (``State.active``).
LIVE_STATES: frozenset[JobState] = frozenset({"PENDING", "RUNNING"})

#: States from which a job never moves again.
TERMINAL_STATES: frozenset[JobState] = frozenset(JOB_STATES) - LIVE_STATES

#: The terminal state a ``JobFailed`` reason leads to; any other reason leads to FAILED.
FAILED_STATE: dict[ev.EndReason, JobState] = {
    "NodeFail": "NODE_FAIL",
    "OutOfMemory": "OUT_OF_MEMORY",
    "TimeLimit": "TIMEOUT",
    "Preempted": "PREEMPTED",
}


def failed_state(reason: ev.EndReason) -> JobState:
    """The state a job ends in when the scheduler concludes ``JobFailed(reason)``."""
    return FAILED_STATE.get(reason, "FAILED")


#: Who appends an event: the gateway (intents), the scheduler (decisions and conclusions), an agent
#: (facts about runs on its node), health (node facts).
Writer = Literal["gateway", "scheduler", "agent", "health"]

#: The machine an event belongs to.
Machine = Literal["job", "node", "reservation", "step"]

#: A node's availability: UP once registered (idle/mixed/allocated are derived from its allocations), DOWN
#: when it stopped responding or an admin downed it.
NodeAvailability = Literal["UP", "DOWN"]

#: A node's drain: NONE, or DRAIN (DRAINING while jobs still run on it, DRAINED once none does).
NodeDrain = Literal["NONE", "DRAIN"]


class JobTransition(msgspec.Struct, frozen=True):
    """An event that moves a job from one of ``sources`` to one of ``targets`` (``None``: no job yet)."""

    event: type[ev.Event]  # the event type
    sources: frozenset[JobState | None]  # states it applies in (None: the job does not exist yet)
    targets: frozenset[JobState]  # states it leads to (several: chosen by the event's fields)
    attempt: Literal["none", "current", "current_or_pending"]  # which run the event must name


class JobMark(msgspec.Struct, frozen=True):
    """An event that changes a job's fields without moving its state; it counts only in ``states``."""

    event: type[ev.Event]  # the event type
    states: frozenset[JobState]  # states in which it changes something


class NodeTransition(msgspec.Struct, frozen=True):
    """An event that moves a node on one axis from one of ``sources`` to ``target``."""

    event: type[ev.Event]  # the event type
    axis: Literal["availability", "drain"]  # which axis it moves
    sources: frozenset[str | None]  # values it applies from (None: the node is not registered yet)
    target: str  # the value it leads to


_PENDING: frozenset[JobState] = frozenset({"PENDING"})
_RUNNING: frozenset[JobState] = frozenset({"RUNNING"})
_LIVE: frozenset[JobState | None] = frozenset(LIVE_STATES)

JOB_TRANSITIONS: tuple[JobTransition, ...] = (
    JobTransition(ev.JobSubmitted, frozenset({None}), _PENDING, "none"),
    JobTransition(ev.JobAllocated, frozenset({"PENDING"}), _RUNNING, "current"),
    JobTransition(ev.JobRequeued, frozenset({"RUNNING"}), _PENDING, "current"),
    # A conclusion names the current run, or attempt -1 for a job that never ran (still PENDING).
    JobTransition(ev.JobCompleted, _LIVE, frozenset({"COMPLETED"}), "current_or_pending"),
    JobTransition(ev.JobFailed, _LIVE, frozenset({"FAILED", *FAILED_STATE.values()}), "current_or_pending"),
    JobTransition(ev.JobCancelled, _LIVE, frozenset({"CANCELLED"}), "current_or_pending"),
)

JOB_MARKS: tuple[JobMark, ...] = (
    JobMark(ev.JobCancelRequested, LIVE_STATES),
    JobMark(ev.JobHoldRequested, _PENDING),
    JobMark(ev.JobReleaseRequested, _PENDING),
    JobMark(ev.JobHeld, _PENDING),
    JobMark(ev.JobReleased, _PENDING),
    JobMark(ev.JobUpdateRequested, _PENDING),
    JobMark(ev.JobUpdated, _PENDING),
    JobMark(ev.JobReasonChanged, _PENDING),  # only remembered: the reason last logged for the job
    JobMark(ev.JobPreempted, _RUNNING),
    JobMark(ev.JobRequeueRequested, _RUNNING),
    JobMark(ev.JobSignalRequested, _RUNNING),
    JobMark(ev.RunStarted, _RUNNING),
    JobMark(ev.RunExited, _RUNNING),
)

NODE_TRANSITIONS: tuple[NodeTransition, ...] = (
    # A registration brings a node up, unless an admin downed it (only NodeResumed ends that).
    NodeTransition(ev.NodeRegistered, "availability", frozenset({None, "UP", "DOWN"}), "UP"),
    NodeTransition(ev.NodeDown, "availability", frozenset({"UP", "DOWN"}), "DOWN"),
    NodeTransition(ev.NodeUp, "availability", frozenset({"DOWN", "UP"}), "UP"),
    NodeTransition(ev.NodeDrained, "drain", frozenset({None, "NONE", "DRAIN"}), "DRAIN"),
    NodeTransition(ev.NodeResumed, "drain", frozenset({"NONE", "DRAIN"}), "NONE"),
)

#: Node facts that move no axis: only recorded (a health report; a failing one is followed by ``NodeDrained``,
#: which moves the drain axis).
NODE_RECORDS: frozenset[type[ev.Event]] = frozenset({ev.NodeHealthReported})

_GATEWAY: tuple[type[ev.Event], ...] = (
    ev.JobSubmitted,
    ev.JobCancelRequested,
    ev.JobHoldRequested,
    ev.JobReleaseRequested,
    ev.JobUpdateRequested,
    ev.JobRequeueRequested,
    ev.JobSignalRequested,
    ev.ReservationCreateRequested,
    ev.ReservationDeleteRequested,
    ev.NodeDrainRequested,
    ev.NodeResumeRequested,
    ev.NodeDownRequested,
)
_SCHEDULER: tuple[type[ev.Event], ...] = (
    ev.JobAllocated,
    ev.JobCompleted,
    ev.JobFailed,
    ev.JobCancelled,
    ev.JobRequeued,
    ev.JobHeld,
    ev.JobReleased,
    ev.JobUpdated,
    ev.JobPreempted,
    ev.JobReasonChanged,
    ev.ReservationCreated,
    ev.ReservationRejected,
    ev.ReservationDeleted,
)
_AGENT: tuple[type[ev.Event], ...] = (
    ev.NodeRegistered,
    ev.RunStarted,
    ev.RunExited,
    ev.StepStarted,
    ev.StepExited,
)
_HEALTH: tuple[type[ev.Event], ...] = (
    ev.NodeDown,
    ev.NodeUp,
    ev.NodeDrained,
    ev.NodeResumed,
    ev.NodeHealthReported,
)

#: The scheduler's decisions: each carries the leader epoch of the scheduler that decided (``epoch``), and
#: every fold ignores one whose epoch is older than the newest it has seen (fencing a deposed leader).
DECISIONS: frozenset[type[ev.Event]] = frozenset(_SCHEDULER)

#: Who appends each event type.
WRITERS: dict[type[ev.Event], Writer] = {
    **dict.fromkeys(_GATEWAY, "gateway"),
    **dict.fromkeys(_SCHEDULER, "scheduler"),
    **dict.fromkeys(_AGENT, "agent"),
    **dict.fromkeys(_HEALTH, "health"),
}


def _machine(event: type[ev.Event]) -> Machine:
    if event in ev.NODE_EVENTS:
        return "node"
    if event in ev.RESERVATION_EVENTS:
        return "reservation"
    if event in (ev.StepStarted, ev.StepExited):
        return "step"
    return "job"


#: The machine each event type belongs to.
MACHINE: dict[type[ev.Event], Machine] = {event: _machine(event) for event in ev.EVENT_TYPES}

#: The job events that move a job's state, by type.
JOB_TRANSITION_OF: dict[type[ev.Event], JobTransition] = {t.event: t for t in JOB_TRANSITIONS}

#: The job events that only change a job's fields, by type.
JOB_MARK_OF: dict[type[ev.Event], JobMark] = {m.event: m for m in JOB_MARKS}


def moves(event: type[ev.Event], before: JobState | None, after: JobState | None) -> bool:
    """True if the tables allow ``event`` to take a job from ``before`` to ``after`` (equal: no move)."""
    if before == after:
        return True
    transition = JOB_TRANSITION_OF.get(event)
    return transition is not None and before in transition.sources and after in transition.targets
