"""A node's power loss, as ``corral demo`` plays it (``stop_all.crash_runs``): every process a run or step
directory of that agent records is SIGKILLed, a pid now someone else's is left alone, and nothing is written
for the agent to report."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.services.agent import procstat
from corral.services.agent.stop_all import crash_runs

pytestmark = pytest.mark.unit


@pytest.fixture
def sessions() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Four real processes, each the leader of its own process group (a supervisor, its task, a step's
    supervisor and its task)."""
    procs = [subprocess.Popen(["sleep", "60"], start_new_session=True) for _ in range(4)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def recorded(pid: int) -> list[int]:
    """[pid, start ticks], as the supervisors record them."""
    ticks = procstat.start_ticks(pid)
    assert ticks is not None
    return [pid, ticks]


def test_every_recorded_process_is_killed_and_nothing_is_written(
    tmp_path: Path, sessions: list[subprocess.Popen[bytes]]
) -> None:
    batch, script, stepd, task = sessions
    node = tmp_path / "node1"
    run, step = node / "jobs" / "7.0", node / "stepd" / "7.0.0"
    for folder, supervisor, group in ((run, batch, script), (step, stepd, task)):
        folder.mkdir(parents=True)
        pids = {"stepd": recorded(supervisor.pid), "tasks": {"0": recorded(group.pid)}}
        (folder / "pids").write_text(json.dumps(pids))
    # A run whose recorded task pid was reused (other start ticks): not ours to kill.
    stale = node / "jobs" / "6.0"
    stale.mkdir()
    other = recorded(task.pid)
    (stale / "pids").write_text(json.dumps({"stepd": [0, 0], "tasks": {"0": [other[0], other[1] + 1]}}))
    before = {p.name for p in node.rglob("*")}

    assert crash_runs(node) == 4
    assert [p.wait(timeout=10) for p in sessions] == [-signal.SIGKILL] * 4
    assert {p.name for p in node.rglob("*")} == before  # no killed marker, no status


def test_a_node_with_no_runs_kills_nothing(tmp_path: Path) -> None:
    assert crash_runs(tmp_path / "node2") == 0
