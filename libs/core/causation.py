"""Why a decision was taken: the event id of the entry that caused it (``Meta.causation_id``), pure.

The fold keeps, for each job, node and reservation, the event ids of the entries a decision may name as its
cause (``record``, called by ``fold.apply`` for every entry it applied), so that the shell can stamp each
decision of ``plan()`` with its cause (``cause_of``) without reading the log, and a replay gives the same.

The rule, decision by decision (the reason a conclusion gives is the cause it names, in the precedence of
``conclude.py``):

================================  ===========================================================================
decision                          caused by
================================  ===========================================================================
``JobAllocated``                  what put the job in the queue as it is: its submission, or its latest
                                  ``JobRequeued``, ``JobReleased`` or ``JobUpdated`` (the run that freed the
                                  resources, or the dependency met, is the occasion, not recorded)
``JobCancelled``                  the ``JobCancelRequested`` that marked the job (the first; a whole array's
                                  marks each task)
``JobRequeued``/``JobFailed``     ``Requested``: the ``JobRequeueRequested``; ``Preempted``: the
                                  ``JobPreempted``; ``NodeFail``: the ``NodeDown`` of the run's first node
                                  that is down (or, for a run its agent lost, its ``RunExited``)
``JobCompleted``, other failures  the batch node's ``RunExited`` of the run (exit code, signal, OOM, time
                                  limit, launch error)
``JobPreempted``                  what put the preemptor in the queue (as ``JobAllocated`` above)
``JobHeld``/``JobReleased``/      the ``JobHoldRequested``/``JobReleaseRequested``/``JobUpdateRequested``
``JobUpdated``                    answered (the newest)
``Reservation*``                  the newest request for the name
================================  ===========================================================================

The facts other services derive are stamped by them: an agent's run and step facts by the ``JobAllocated``
their launch order names (``LaunchOrder.cause_id``, from ``Job.causes``), health's answers by the admin's
request; a ``NodeDown`` for missed heartbeats and the gateway's intents have no cause in the log (the
reason is in the body; the actor is the user).
"""

from __future__ import annotations

from typing import Any

from corral.libs.core.state import NO_CAUSES, Job, State, array_tasks
from corral.schemas import events as ev

#: The entries that put a job in the queue as it is (kept in ``Job.queued_by``, apart from the other causes:
#: a pending job has no other, and so no dict of its own).
_QUEUEING = (ev.JobSubmitted, ev.JobRequeued, ev.JobReleased, ev.JobUpdated)
#: Entries kept by their tag, the newest applied one.
_BY_TAG = (
    ev.JobPreempted,
    ev.JobRequeueRequested,
    ev.JobHoldRequested,
    ev.JobReleaseRequested,
    ev.JobUpdateRequested,
)


def _tag(kind: type[ev.Event]) -> str:
    tag = kind.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


#: The key of ``Job.causes`` for the current run's allocation (the cause of the agents' facts about it).
ALLOCATED = _tag(ev.JobAllocated)
_CANCEL = _tag(ev.JobCancelRequested)
_RUN_EXITED = _tag(ev.RunExited)
_PREEMPTED = _tag(ev.JobPreempted)


def record(state: State, env: ev.Envelope) -> None:
    """Keep the event id of an entry the fold applied where a later decision will look for its cause."""
    # (Any: the kind, looked up by type, says which event it is, as the isinstance checks it replaces did.)
    body: Any = env.body
    event_id = env.meta.event_id
    kind = _KINDS.get(type(body)) or _kind_of(type(body))
    if kind == _NODE_DOWN:
        node = state.nodes.get(body.node)
        if node is not None:
            node.down_id = event_id
        return
    if kind == _RESV_REQUEST:
        state.resv_causes[body.name] = event_id
        return
    if kind == _RESV_ANSWER:
        state.resv_causes.pop(body.name, None)  # answered
        return
    if kind == _NO_CAUSE:
        return
    job = state.jobs.get(body.job_id)
    if job is None:
        return
    if kind == _CANCEL_REQUEST:
        # The first cancel that marked a job is the one it is cancelled by (``fold._cancel_requested``).
        targets = array_tasks(state, job.job_id) if body.whole_array else [job]
        for target in targets:
            live = target.cancel_by is not None and target.state in ("PENDING", "RUNNING")
            if live and _CANCEL not in target.causes:
                target.causes = {**target.causes, _CANCEL: event_id}
    elif job.state not in ("PENDING", "RUNNING"):
        job.causes, job.queued_by = NO_CAUSES, ""  # an ended job decides nothing more
    elif kind == _SUBMITTED:
        if not job.array_job_id:
            job.causes, job.queued_by = NO_CAUSES, event_id
            return
        for task in array_tasks(state, job.job_id) or [job]:
            task.causes, task.queued_by = NO_CAUSES, event_id
    elif kind == _QUEUED:
        job.queued_by = event_id
    elif kind == ALLOCATED:
        # A new run: what the previous one's conclusion was caused by is of no use any more.
        job.causes = {ALLOCATED: event_id}
    elif kind == _RUN_EXITED:
        if job.allocations and body.node == job.allocations[0].node and body.attempt == job.restart_count:
            job.causes = {**job.causes, _RUN_EXITED: event_id}
    elif kind == _BY_TAG_KIND:
        job.causes = {**job.causes, _tag(type(body)): event_id}


# What ``record`` does with an entry, by the body's type: decided once per type (by the rules above, in
# their order) and kept, instead of a chain of isinstance checks per entry.
_NODE_DOWN, _RESV_REQUEST, _RESV_ANSWER, _NO_CAUSE = "node_down", "resv_request", "resv_answer", "none"
_CANCEL_REQUEST, _SUBMITTED, _QUEUED = "cancel", "submitted", "queued"
_BY_TAG_KIND, _OTHER = "by_tag", "other"
_KINDS: dict[type, str] = {}


def _kind_of(kind: type) -> str:
    rules: tuple[tuple[type | tuple[type, ...], str], ...] = (
        (ev.NodeDown, _NODE_DOWN),
        ((ev.ReservationCreateRequested, ev.ReservationDeleteRequested), _RESV_REQUEST),
        ((ev.ReservationCreated, ev.ReservationRejected, ev.ReservationDeleted), _RESV_ANSWER),
        ((*ev.NODE_EVENTS, *ev.RESERVATION_EVENTS, ev.StepStarted, ev.StepExited), _NO_CAUSE),
        (ev.JobCancelRequested, _CANCEL_REQUEST),
        (ev.JobSubmitted, _SUBMITTED),
        (_QUEUEING, _QUEUED),
        (ev.JobAllocated, ALLOCATED),
        (ev.RunExited, _RUN_EXITED),
        (_BY_TAG, _BY_TAG_KIND),
    )
    found = next((name for types, name in rules if issubclass(kind, types)), _OTHER)
    _KINDS[kind] = found
    return found


def cause_of(state: State, decision: ev.Event) -> str | None:
    """The event id of the entry that caused ``decision``, from the state the decision was taken on."""
    if isinstance(decision, ev.ReservationCreated | ev.ReservationRejected | ev.ReservationDeleted):
        return state.resv_causes.get(decision.name)
    if isinstance(decision, ev.NodeEvent | ev.ReservationEvent | ev.StepStarted | ev.StepExited):
        return None
    job = state.jobs.get(decision.job_id)
    if job is None:
        return None
    causes = job.causes
    if isinstance(decision, ev.JobAllocated):
        return job.queued_by or None
    if isinstance(decision, ev.JobPreempted):
        preemptor = state.jobs.get(decision.by_job)
        return (preemptor.queued_by or None) if preemptor is not None else None
    if isinstance(decision, ev.JobCancelled):
        return causes.get(_CANCEL)
    if isinstance(decision, ev.JobRequeued | ev.JobFailed):
        return _ended_by(state, job, decision.reason)
    if isinstance(decision, ev.JobCompleted):
        return causes.get(_RUN_EXITED)
    if isinstance(decision, ev.JobHeld):
        return causes.get(_tag(ev.JobHoldRequested))
    if isinstance(decision, ev.JobReleased):
        return causes.get(_tag(ev.JobReleaseRequested))
    if isinstance(decision, ev.JobUpdated):
        return causes.get(_tag(ev.JobUpdateRequested))
    return None


def _ended_by(state: State, job: Job, reason: str) -> str | None:
    """The cause a requeue's or a failure's reason names."""
    if reason == "Requested":
        return job.causes.get(_tag(ev.JobRequeueRequested))
    if reason == "Preempted":
        return job.causes.get(_PREEMPTED)
    if reason == "NodeFail" and job.run_exit is None:
        for alloc in job.allocations:
            node = state.nodes.get(alloc.node)
            if node is not None and not node.up and node.down_id:
                return node.down_id
    return job.causes.get(_RUN_EXITED)
