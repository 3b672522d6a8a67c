"""A launch srun asks again (its answer was lost, or slow) finds the step it started: under way, running,
or ended lately; a key of another run, or one never seen, finds nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_jobenv import launch as launch_order

from corral.schemas.steps import StepLaunch
from corral.services.agent import step_state
from corral.services.agent.step_state import Coordinated, StepTable
from corral.services.agent.stepdir import CoordRecord, StepDir


def coordinated(tmp_path: Path, key: str, job_id: int = 7, attempt: int = 0, step_id: int = 0) -> Coordinated:
    order = launch_order(job_id=job_id, attempt=attempt)
    launch = StepLaunch(job_id=job_id, key=key, argv=["true"], cwd="/")
    return Coordinated(
        order=order,
        step_id=step_id,
        launch=launch,
        places=[],
        dir=StepDir(tmp_path, (job_id, attempt, step_id)),
    )


def test_a_running_step_is_found_by_its_runs_key_only(tmp_path: Path) -> None:
    table = StepTable()
    step = coordinated(tmp_path, "k1")
    table.coordinated[(7, 0, 0)] = step
    assert table.launched("k1", 7, 0) is step
    assert table.launched("k1", 7, 1) is None  # another attempt of the job
    assert table.launched("k1", 8, 0) is None  # another job
    assert table.launched("k2", 7, 0) is None


def test_an_ended_step_is_still_found_and_the_oldest_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_state, "ENDED_KEPT", 2)
    table = StepTable()
    steps = [coordinated(tmp_path, f"k{i}", step_id=i) for i in range(3)]
    for step in steps:
        table.remember_ended(step)
    assert table.launched("k0", 7, 0) is None  # dropped: the oldest of three, two kept
    assert table.launched("k1", 7, 0) is steps[1]
    assert table.launched("k2", 7, 0) is steps[2]
    assert table.launched("k2", 8, 0) is None


def test_a_step_resumed_from_its_record_counts_as_launched(tmp_path: Path) -> None:
    step = coordinated(tmp_path, "k1")
    record = CoordRecord(order=step.order, step_id=3, launch=step.launch, places=[])
    resumed = Coordinated.resumed_from(step.dir, record)
    assert resumed.launched.is_set() and resumed.resumed and resumed.step_id == 3
    assert not step.launched.is_set()  # a launch under way
