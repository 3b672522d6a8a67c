"""Jobs start with every signal at its default action, even when the agent was started with one ignored
(``nohup corral up``: SIGHUP), so that a batch script or a step's task can trap it (``sigreset.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from corral.services.agent import stepd
from corral.services.agent.stepdir import OutputTarget, StepDir, StepSpec, TaskSpec

pytestmark = pytest.mark.unit

# Traps HUP, sends itself one, and says what it saw: a shell started with HUP ignored cannot trap it, so
# the kill does nothing and only "done" is printed.
TRAPS_HUP = "trap 'echo trapped' HUP; kill -HUP $$; echo done"


def as_under_nohup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_a_batch_script_can_trap_a_signal_its_agent_ignores(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\n{TRAPS_HUP}\n")
    script.chmod(0o755)
    # the batch step, as runner.batch_spec writes it: one task, the script, in the run's directory
    run_dir = tmp_path / "run"
    sdir = StepDir.batch(run_dir, 1, 0)
    sdir.create()
    task = TaskSpec(
        task=0,
        argv=[str(script)],
        cwd=str(tmp_path),
        env={"PATH": os.defpath},
        stdout=OutputTarget(path=str(tmp_path / "job.out")),
    )
    sdir.write_spec(StepSpec(user="u", key="", job_id=1, attempt=0, step_id=-1, tasks=[task], batch=True))
    done = subprocess.run(
        [sys.executable, "-I", "-S", stepd.__file__, str(run_dir)],
        capture_output=True,
        preexec_fn=as_under_nohup,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "job.out").read_text() == "trapped\ndone\n"
    assert (run_dir / "status").read_text() == '{"exit_code": 0, "signal": 0, "oom": false}'


def test_a_step_task_can_trap_a_signal_its_agent_ignores(tmp_path: Path) -> None:
    sdir = StepDir(tmp_path / "stepd", (1, 0, 0))
    sdir.create()
    task = TaskSpec(
        task=0,
        argv=["bash", "-c", TRAPS_HUP],
        cwd=str(sdir.path),
        env={"PATH": os.defpath},
        stdout=OutputTarget(path=str(sdir.spool("out", 0))),
    )
    sdir.write_spec(StepSpec(user="u", key="k", job_id=1, attempt=0, step_id=0, tasks=[task]))
    done = subprocess.run(
        [sys.executable, "-I", "-S", stepd.__file__, str(sdir.path)],
        capture_output=True,
        preexec_fn=as_under_nohup,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert sdir.spool("out", 0).read_text() == "trapped\ndone\n"
