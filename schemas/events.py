"""The v1 events of the log: a tagged union of frozen msgspec Structs inside one ``Envelope``.

Tags are stable forever. Fields are added only at the end, with defaults.

The Structs live by subject: ``job_spec.py`` (what a job asks for), ``job_events.py`` (the job's intents,
decisions and conclusions), ``run_events.py`` (the agents' run and step facts), ``node_events.py`` and
``reservation_events.py``; every one of them is re-exported here, where the union and the envelope are.
"""

from __future__ import annotations

import msgspec

from corral.schemas.ids import (
    JobId,
    NodeName,
)
from corral.schemas.job_events import (
    MAX_REASON_DETAIL,
    EndReason,
    JobAllocated,
    JobCancelled,
    JobCancelRequested,
    JobCompleted,
    JobFailed,
    JobHeld,
    JobHoldRequested,
    JobPreempted,
    JobReasonChanged,
    JobReleased,
    JobReleaseRequested,
    JobRequeued,
    JobRequeueRequested,
    JobSignalRequested,
    JobSubmitted,
    JobUpdated,
    JobUpdateRequested,
    NodeAllocation,
    PendingReason,
    PreemptMode,
    RequeueReason,
    SignalScope,
)
from corral.schemas.job_spec import (
    ArrayRange,
    ArraySpec,
    Constraint,
    Dependencies,
    Dependency,
    DependencyType,
    JobSpec,
    OpenMode,
    WarnSignal,
)
from corral.schemas.node_events import (
    MAX_HEALTH_CHECKS,
    MAX_NODE_REASON,
    NODE_EVENTS,
    HealthCheck,
    HealthCheckKind,
    HealthSeverity,
    HealthSource,
    NodeDown,
    NodeDownRequested,
    NodeDrained,
    NodeDrainRequested,
    NodeEvent,
    NodeHealthReported,
    NodeRegistered,
    NodeResumed,
    NodeResumeRequested,
    NodeUp,
)
from corral.schemas.reservation_events import (
    RESERVATION_EVENTS,
    ReservationCreated,
    ReservationCreateRequested,
    ReservationDeleted,
    ReservationDeleteRequested,
    ReservationEvent,
    ReservationFlag,
    ReservationRejected,
)
from corral.schemas.run_events import (
    MAX_STEP_TASKS,
    MAX_STEP_TASKS_BYTES,
    MAX_TASK_ERROR,
    RunExited,
    RunStarted,
    StepExited,
    StepStarted,
    TaskOutcome,
)

# Every Struct and alias of the submodules is part of this module's interface.
__all__ = [
    "EVENT_TYPES",
    "MAX_HEALTH_CHECKS",
    "MAX_NODE_REASON",
    "MAX_REASON_DETAIL",
    "MAX_STEP_TASKS",
    "MAX_STEP_TASKS_BYTES",
    "MAX_TASK_ERROR",
    "NODE_EVENTS",
    "RESERVATION_EVENTS",
    "RETIRED_TAGS",
    "ArrayRange",
    "ArraySpec",
    "Constraint",
    "Dependencies",
    "Dependency",
    "DependencyType",
    "EndReason",
    "Envelope",
    "Event",
    "HealthCheck",
    "HealthCheckKind",
    "HealthSeverity",
    "HealthSource",
    "JobAllocated",
    "JobCancelRequested",
    "JobCancelled",
    "JobCompleted",
    "JobFailed",
    "JobHeld",
    "JobHoldRequested",
    "JobId",
    "JobPreempted",
    "JobReasonChanged",
    "JobReleaseRequested",
    "JobReleased",
    "JobRequeueRequested",
    "JobRequeued",
    "JobSignalRequested",
    "JobSpec",
    "JobSubmitted",
    "JobUpdateRequested",
    "JobUpdated",
    "Meta",
    "NodeAllocation",
    "NodeDown",
    "NodeDownRequested",
    "NodeDrainRequested",
    "NodeDrained",
    "NodeEvent",
    "NodeHealthReported",
    "NodeName",
    "NodeRegistered",
    "NodeResumeRequested",
    "NodeResumed",
    "NodeUp",
    "OpenMode",
    "PendingReason",
    "PreemptMode",
    "RequeueReason",
    "ReservationCreateRequested",
    "ReservationCreated",
    "ReservationDeleteRequested",
    "ReservationDeleted",
    "ReservationEvent",
    "ReservationFlag",
    "ReservationRejected",
    "RunExited",
    "RunStarted",
    "SignalScope",
    "StepExited",
    "StepStarted",
    "TaskOutcome",
    "WarnSignal",
]

#: Tags that were once used and must never be used again.
RETIRED_TAGS: frozenset[str] = frozenset()


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
    | JobReasonChanged
    | NodeHealthReported
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
    JobReasonChanged,
    NodeHealthReported,
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
