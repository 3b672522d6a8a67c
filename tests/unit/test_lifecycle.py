"""The state machines of ``schemas.lifecycle`` cover every event, and the fold moves jobs only along them."""

from __future__ import annotations

from typing import get_args

import pytest
from builders import semantic
from hypothesis import given, settings
from random_logs import logs

from corral.libs.core import fold
from corral.libs.core.state import State
from corral.libs.sim import reactions
from corral.schemas import api, lifecycle
from corral.schemas import events as ev
from corral.services.accounting import projection
from corral.services.gateway import control

pytestmark = pytest.mark.unit

ALL = set(ev.EVENT_TYPES)


def test_every_event_has_a_writer_and_a_machine() -> None:
    assert set(lifecycle.WRITERS) == ALL
    assert set(lifecycle.MACHINE) == ALL


def test_every_job_event_either_moves_a_job_or_marks_one() -> None:
    job_events = {e for e, machine in lifecycle.MACHINE.items() if machine == "job"}
    moving, marking = set(lifecycle.JOB_TRANSITION_OF), set(lifecycle.JOB_MARK_OF)
    assert not moving & marking
    assert moving | marking == job_events


def test_every_node_event_a_fact_moves_is_a_node_transition() -> None:
    facts = {
        e
        for e, machine in lifecycle.MACHINE.items()
        if machine == "node" and lifecycle.WRITERS[e] != "gateway"
    }
    moving = {t.event for t in lifecycle.NODE_TRANSITIONS}
    assert not moving & lifecycle.NODE_RECORDS
    assert moving | lifecycle.NODE_RECORDS == facts


def test_the_api_shows_the_folds_states_and_requeued() -> None:
    assert set(get_args(api.JobState)) == {*lifecycle.JOB_STATES, "REQUEUED"}
    assert set(lifecycle.JOB_STATES) - {"PENDING", "RUNNING"} == api.TERMINAL_STATES


def test_the_fold_handles_or_deliberately_ignores_every_event_type() -> None:
    handled = {*fold.HANDLERS, ev.JobSubmitted}
    assert not handled & set(fold.IGNORED)
    assert handled | set(fold.IGNORED) == ALL


def test_an_unhandled_event_type_is_not_folded() -> None:
    state = State()
    outcome = fold.apply(state, 1, _envelope(ev.NodeDrainRequested(node="n1", user="root", reason="r")))
    assert (outcome.applied, outcome.reason, state.last_seq) == (False, "not_folded", 1)


@settings(max_examples=300, deadline=None)
@given(logs())
def test_the_fold_moves_jobs_only_along_the_lifecycle(entries: list[tuple[int, ev.Envelope]]) -> None:
    state = State()
    for seq, env in entries:
        before = {job_id: job.state for job_id, job in state.jobs.items()}
        unchanged = _subjects(state)
        outcome = fold.apply(state, seq, env)
        assert outcome.reason != "handler_failed", outcome.error
        for job_id in before.keys() | state.jobs.keys():
            after = state.jobs[job_id].state if job_id in state.jobs else None
            assert lifecycle.moves(type(env.body), before.get(job_id), after), (env.body, before, after)
        if not outcome.applied:
            # An ignored entry changes nothing but the log's position and clock, and the epoch seen.
            assert _subjects(state) == unchanged, (env.body, outcome)


def _subjects(state: State) -> bytes:
    """What the entries' subjects are (jobs, nodes...): the state's bytes without positions and epoch."""
    epoch, state.epoch = state.epoch, 0
    try:
        return semantic(state)
    finally:
        state.epoch = epoch


def _envelope(body: ev.Event, at: float = 1.0) -> ev.Envelope:
    return ev.Envelope(meta=ev.Meta(event_id="e", occurred_at=at, actor="test"), body=body)


def test_an_entry_a_handler_raises_on_is_skipped_and_counted() -> None:
    state = State()
    spec = ev.JobSpec(name="j", script="", workdir="/tmp", gpus_per_node=2)
    bodies: list[ev.Event] = [
        ev.NodeRegistered(node="n1", cpus=4, mem_mb=1000, gpus=2),
        ev.JobSubmitted(job_id=1, user="alice", spec=spec),
        ev.JobAllocated(
            job_id=1,
            attempt=0,
            partition="gpu",
            allocations=[ev.NodeAllocation(node="n1", gpus=[0, 1])],
            time_limit_s=None,
        ),
    ]
    for seq, body in enumerate(bodies, start=1):
        assert fold.apply(state, seq, _envelope(body, at=float(seq))).applied
    # Billing two GPUs for 1e308 seconds is infinite: fair_share.charge raises.
    outcome = fold.apply(state, 4, _envelope(ev.JobCompleted(job_id=1, attempt=0), at=1e308))
    assert (outcome.applied, outcome.reason) == (False, "handler_failed")
    assert outcome.error.startswith("ValueError: usage charged")
    assert (state.skipped, state.last_seq, state.now, state.jobs[1].state) == (1, 4, 3.0, "RUNNING")


def test_accounting_converts_or_deliberately_ignores_every_event_type() -> None:
    assert not set(projection.CONVERTERS) & set(projection.IGNORED)
    assert set(projection.CONVERTERS) | set(projection.IGNORED) == ALL


def test_the_gateway_knows_the_phase_after_every_event_type_on_a_jobs_subjects() -> None:
    assert not set(control.PHASE_AFTER) & set(control.NOT_ON_JOB_SUBJECTS)
    assert set(control.PHASE_AFTER) | set(control.NOT_ON_JOB_SUBJECTS) == ALL
    # The newest entry of a job is one on its subjects: the job machine's events, and only those.
    assert set(control.PHASE_AFTER) == {e for e, machine in lifecycle.MACHINE.items() if machine == "job"}


def test_the_simulator_reacts_to_writes_or_never_sees_every_event_type() -> None:
    tables = [set(reactions.REACTIONS), set(reactions.WRITES), set(reactions.IGNORED)]
    assert sum(len(t) for t in tables) == len(set.union(*tables))
    assert set.union(*tables) == ALL
    # It reacts to every decision plan() may make, and to nothing else; the scheduler's other decision, the
    # pending reason log (reason_log.py, beside plan()), is one its shell never makes.
    scheduler = {e for e, writer in lifecycle.WRITERS.items() if writer == "scheduler"}
    assert set(reactions.REACTIONS) == scheduler - {ev.JobReasonChanged}
    assert ev.JobReasonChanged in reactions.IGNORED
