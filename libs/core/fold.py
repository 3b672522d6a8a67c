"""The fold of the log into the scheduler's state (``state.py``).

``apply(state, seq, envelope)`` is deterministic: no IO, no clock (times come from the events),
no randomness, so replaying the log rebuilds exactly the live state (``encode_state`` gives the
bytes to compare). The fold is also the guard of the invariants (see ``state.py``), and it says what it
did with each entry: applied, or ignored with a reason (``outcome.Outcome``).

Dispatch: intents and job control here, runs (allocation, run facts, conclusions) in ``fold_runs.py``,
nodes in ``fold_nodes.py``, reservations in ``reservations.py``. Before any handler, every scheduler decision
(``lifecycle.DECISIONS``) passes the leader-epoch fence (``_current_epoch``): a deposed leader's decision,
of any type, changes nothing. The event types the fold leaves alone on
purpose are ``IGNORED``, each with its reason; every other event type has a handler (a test checks).

An entry that cannot be applied never stalls its job, node or reservation: a conditional append expects
the newest sequence over the owner's subjects, so the entry still moves that sequence. That holds for an
entry that fails to decode or whose body claims another job or node than its subject (``skip``, which the
shell calls: ``undecodable``) and for one a handler raises on (``handler_failed``); both are counted in
``State.skipped`` and a shell sends them to the dead letters. Handlers check before they change, so a
raise in a check leaves the state as it was; whatever a handler did change before raising, a replay does
the same, so the live state and the replayed state stay equal.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

import msgspec

from corral.libs.core import causation, retention
from corral.libs.core.fold_nodes import NODE_HANDLERS, live_run, mark_requeue
from corral.libs.core.fold_runs import RUN_HANDLERS, job_for
from corral.libs.core.outcome import APPLIED, Outcome, failed, ignored
from corral.libs.core.reservations import (
    RESERVATION_HANDLERS,
    expire_reservations,
)
from corral.libs.core.state import (
    HoldControl,
    Job,
    LoggedReason,
    PendingSignal,
    SpecChange,
    State,
    array_tasks,
)
from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.schemas import events as ev
from corral.schemas import lifecycle, subjects
from corral.schemas.job_spec import NO_ENVIRONMENT
from corral.schemas.slim import SlimJobSpec

#: A fold handler: (state, sequence, occurred_at, body) -> what it did.
Handler = Callable[[State, int, float, Any], Outcome]


def fold(entries: list[tuple[int, ev.Envelope]], state: State | None = None) -> State:
    """Apply entries (sequence, envelope) in order to ``state`` (a new one if None)."""
    state = state if state is not None else State()
    for seq, env in entries:
        apply(state, seq, env)
    return state


def apply(state: State, seq: int, env: ev.Envelope) -> Outcome:
    """Apply one log entry; entries at or below ``state.last_seq`` were applied already. For a state someone
    follows (``changes.py``), note what the entry may have changed: the job it names, and the node it names
    or else the nodes of that job's run before and after it."""
    journal = state.__dict__.get("changes")
    if journal is None:
        return _apply(state, seq, env)
    body = env.body
    job_id = getattr(body, "job_id", None)
    node = getattr(body, "node", None)
    if node is not None:
        try:
            return _apply(state, seq, env)
        finally:
            journal.touched(job_id, (node,))
    job = state.jobs.get(job_id) if job_id is not None else None
    before = job.allocations if job is not None else ()
    try:
        return _apply(state, seq, env)
    finally:
        job = state.jobs.get(job_id) if job_id is not None else None
        after = job.allocations if job is not None else ()
        journal.touched(job_id, map(_node_of, before if after is before else [*before, *after]))


#: An allocation's node (in C).
_node_of = attrgetter("node")


def _apply(state: State, seq: int, env: ev.Envelope) -> Outcome:
    """``apply``, without the notes."""
    if seq <= state.last_seq:
        return ignored("replayed")
    state.last_seq = seq
    clock, at = state.now, env.meta.occurred_at
    if at > clock:  # (max(), without the call: this runs for every entry of a rebuild)
        state.now = at
    if state.reservations:
        expire_reservations(state)
    ended, due = state.ended, state.ended_from
    if due < len(ended) and ended[due][0] + state.min_job_age_s <= clock:
        retention.forget_due(state, clock)  # ended jobs MinJobAge old before this entry (``retention.py``)
    body = env.body
    try:
        if type(body) in lifecycle.DECISIONS and not _current_epoch(state, seq, body):
            return ignored("stale_epoch")
        if isinstance(body, ev.JobSubmitted):
            outcome = _submitted(state, seq, env.meta.occurred_at, body, env.meta.traceparent)
        else:
            handler = HANDLERS.get(type(body))
            if handler is None:
                return ignored("not_folded")
            outcome = handler(state, seq, env.meta.occurred_at, body)
        if outcome.applied:
            causation.record(state, env)
        return outcome
    except Exception as exc:
        # A poison entry (a handler's bug, or a value nothing checked) must not stop the fold, nor every
        # replay after it: it is skipped, counted, and its outcome carries the error for the shell.
        state.skipped += 1
        state.now = clock  # nor may its time move the log's clock
        _owner_moves(state, seq, subjects.event_subject(body))
        return failed(exc)


def skip(state: State, seq: int, subject: str) -> Outcome:
    """Fold a log entry that has no event to apply (it failed to decode, or its body belongs on another
    subject: ``ports.decode_entry``): it changes nothing but the log's position and its subject's owner's
    sequence, so a later decision about that job or reservation still appends (``undecodable``)."""
    if seq <= state.last_seq:
        return ignored("replayed")
    state.last_seq = seq
    state.skipped += 1
    _owner_moves(state, seq, subject)
    return ignored("undecodable")


def _owner_moves(state: State, seq: int, subject: str) -> None:
    """The entry at ``seq`` on ``subject`` is its job's or reservation's newest (nodes' sequences are
    health's: the scheduler appends nothing conditional on a node)."""
    owner = subjects.entry_owner(subject)
    if owner is None:
        return
    kind, name = owner
    if kind == "job":
        job_for(state, seq, int(name))
    elif kind == "resv":
        state.resv_seqs[name] = seq


def _current_epoch(state: State, seq: int, body: Any) -> bool:
    """The fence against a deposed leader: True if a decision's epoch is not older than the newest seen (which
    it raises to its own); False if it is: it changes nothing but its subject's sequence (the next conditional
    append on that subject expects this entry)."""
    if body.epoch >= state.epoch:
        state.epoch = body.epoch
        return True
    if isinstance(body, ev.RESERVATION_EVENTS):
        state.resv_seqs[body.name] = seq
    else:
        job_for(state, seq, body.job_id)
    return False


def _submitted(state: State, seq: int, at: float, body: ev.JobSubmitted, traceparent: str | None) -> Outcome:
    array = body.spec.array
    if array is None:
        # (A single job, most submissions: the loop below for one id, without its lists.)
        if body.job_id in state.jobs or (state.forgotten and retention.is_forgotten(state, body.job_id)):
            return ignored("duplicate")
        state.active[body.job_id] = True
        job = state.jobs[body.job_id] = Job(
            job_id=body.job_id,
            user=body.user,
            spec=slim_spec(body.spec),
            submit_time=at,
            last_seq=seq,
            traceparent=traceparent,
            held="user" if body.spec.held else "",
            submit_seq=seq,
        )
        if state.min_job_age_s:
            retention.jobs_submitted(state, [job])
        return APPLIED
    try:
        indices: list[int | None] = [None] if array is None else list(array_indices(array))
    except FormatError:
        return ignored("bad_array")
    first = body.job_id
    ids = range(first, first + len(indices))
    # All or nothing: an array whose block of ids is not wholly free is not accepted at all.
    if any(job_id in state.jobs or retention.is_forgotten(state, job_id) for job_id in ids):
        return ignored("duplicate")
    # The state keeps what scheduling needs: the script and the exported environment (most of a
    # submission's bytes) stay in the log, where the shell reads them back to launch (``submit_seq``).
    spec = slim_spec(body.spec)
    tasks = []
    for job_id, index in zip(ids, indices, strict=True):
        state.active[job_id] = True
        task = state.jobs[job_id] = Job(
            job_id=job_id,
            user=body.user,
            spec=spec,
            submit_time=at,
            last_seq=seq if job_id == first else 0,
            traceparent=traceparent,
            held="user" if body.spec.held else "",
            array_job_id=first if index is not None else 0,
            array_task_id=index,
            submit_seq=seq,
        )
        tasks.append(task)
    retention.jobs_submitted(state, tasks)
    return APPLIED


def slim_spec(spec: ev.JobSpec) -> SlimJobSpec:
    """A submission's spec as the state keeps it: without the script and the exported environment, always a
    ``SlimJobSpec`` (so that a spec decoded slim from the log and one slimmed here are equal, and encode
    alike). One decoded slim is kept as it is; any other is copied field by field, unchecked (as a
    constructor does: one built in Python is taken as it is)."""
    if type(spec) is SlimJobSpec:
        if not spec.script and not spec.environment:
            return spec
        return msgspec.structs.replace(spec, script="", environment=NO_ENVIRONMENT)
    fields = msgspec.structs.asdict(spec)
    del fields["script"], fields["environment"]
    return SlimJobSpec(**fields)


def _cancel_requested(state: State, seq: int, at: float, body: ev.JobCancelRequested) -> Outcome:
    job = job_for(state, seq, body.job_id)
    if job is None:
        return ignored("unknown_job")
    # The entry is on the first task's subject only: the other tasks' last_seq stays as it is.
    targets = array_tasks(state, job.job_id) if body.whole_array else [job]
    marked = False
    for target in targets:
        if target.state in ("PENDING", "RUNNING") and target.cancel_by is None:
            target.cancel_by = body.user
            marked = True
    return APPLIED if marked else ignored("wrong_state")


def _requeue_requested(state: State, seq: int, at: float, body: ev.JobRequeueRequested) -> Outcome:
    return mark_requeue(job_for(state, seq, body.job_id), body.user, body.hold)


def _signal_requested(state: State, seq: int, at: float, body: ev.JobSignalRequested) -> Outcome:
    job = job_for(state, seq, body.job_id)
    # A signal is for the run that is live now; one that ended (or a pending job) gets none.
    problem = live_run(job)
    if problem is not None:
        return problem
    assert job is not None
    if any(s.request_id == body.request_id for s in job.signals):
        return ignored("duplicate")
    signal = PendingSignal(request_id=body.request_id, signal=body.signal, scope=body.scope)
    job.signals = [*job.signals, signal]
    return APPLIED


def _pending_job(state: State, seq: int, job_id: int) -> Job | Outcome:
    """The pending job an entry is about, or why it changes nothing."""
    job = job_for(state, seq, job_id)
    if job is None:
        return ignored("unknown_job")
    return job if job.state == "PENDING" else ignored("wrong_state")


def _control_requested(
    state: State, seq: int, at: float, body: ev.JobHoldRequested | ev.JobReleaseRequested
) -> Outcome:
    # Only a pending job can be held or released; a request that finds the job started is moot.
    job = _pending_job(state, seq, body.job_id)
    if isinstance(job, Outcome):
        return job
    release = isinstance(body, ev.JobReleaseRequested)
    job.control = HoldControl(release=release, user=body.user, admin=body.admin)
    return APPLIED


def _held(state: State, seq: int, at: float, body: ev.JobHeld) -> Outcome:
    job = _pending_job(state, seq, body.job_id)
    if isinstance(job, Outcome):
        return job
    job.held = "admin" if body.admin else "user"
    job.control = None
    return APPLIED


def _released(state: State, seq: int, at: float, body: ev.JobReleased) -> Outcome:
    job = _pending_job(state, seq, body.job_id)
    if isinstance(job, Outcome):
        return job
    if not job.held:
        return ignored("duplicate")
    job.held = ""
    job.control = None
    job.priority_override = None
    return APPLIED


def _update_requested(state: State, seq: int, at: float, body: ev.JobUpdateRequested) -> Outcome:
    job = _pending_job(state, seq, body.job_id)
    if isinstance(job, Outcome):
        return job
    before = job.change or SpecChange(user=body.user)
    job.change = SpecChange(
        user=body.user,
        time_limit_s=body.time_limit_s if body.time_limit_s is not None else before.time_limit_s,
        partition=body.partition if body.partition is not None else before.partition,
        priority=body.priority if body.priority is not None else before.priority,
    )
    return APPLIED


def _updated(state: State, seq: int, at: float, body: ev.JobUpdated) -> Outcome:
    job = _pending_job(state, seq, body.job_id)
    if isinstance(job, Outcome):
        return job
    job.spec = msgspec.structs.replace(job.spec, time_limit_s=body.time_limit_s, partition=body.partition)
    job.change = None
    # Slurm: Priority=0 holds the job (JobHeldAdmin); a release gives it its computed priority back.
    if body.priority == 0:
        job.held, job.priority_override = "admin", None
    else:
        job.priority_override = body.priority
    return APPLIED


def _reason_changed(state: State, seq: int, at: float, body: ev.JobReasonChanged) -> Outcome:
    # Only remembered, for the next cycle's comparison (``reason_log.py``): it decides nothing.
    job = _pending_job(state, seq, body.job_id)
    if isinstance(job, Outcome):
        return job
    if body.attempt != job.restart_count:
        return ignored("stale_attempt")
    job.logged_reason = LoggedReason(attempt=body.attempt, reason=body.reason, detail=body.detail)
    return APPLIED


#: The handler of each event type the fold applies (``JobSubmitted`` is ``apply``'s own: it needs the
#: envelope's trace context).
HANDLERS: dict[type, Handler] = {
    ev.JobCancelRequested: _cancel_requested,
    ev.JobHoldRequested: _control_requested,
    ev.JobReleaseRequested: _control_requested,
    ev.JobHeld: _held,
    ev.JobReleased: _released,
    ev.JobUpdateRequested: _update_requested,
    ev.JobUpdated: _updated,
    ev.JobReasonChanged: _reason_changed,
    ev.JobRequeueRequested: _requeue_requested,
    ev.JobSignalRequested: _signal_requested,
    **RUN_HANDLERS,
    **NODE_HANDLERS,
    **RESERVATION_HANDLERS,
}

#: The event types the fold leaves alone on purpose, and why.
IGNORED: dict[type, str] = {
    ev.StepStarted: "steps are accounting's record; the scheduler decides from runs, not steps",
    ev.StepExited: "steps are accounting's record; the scheduler decides from runs, not steps",
    ev.NodeDrainRequested: "an admin's intent: health answers it with NodeDrained, which the fold applies",
    ev.NodeResumeRequested: "an admin's intent: health answers it with NodeResumed, which the fold applies",
    ev.NodeDownRequested: "an admin's intent: health answers it with NodeDown, which the fold applies",
    ev.NodeHealthReported: "a record: health follows a failing one with NodeDrained, which the fold applies",
}
