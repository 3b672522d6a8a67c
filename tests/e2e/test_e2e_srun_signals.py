"""srun passes the signals of the batch step on to its tasks, on every node, as Slurm's srun does; steps
outlive the agents' poll; srun appends to its files in a job submitted with --open-mode=append."""

from __future__ import annotations

import pytest
from e2e_cli import BIN, Cli, wait_for_line

pytestmark = pytest.mark.e2e

#: Two tasks on two nodes note USR1 and TERM and end after 3 s; the batch shell reports srun's status.
SCRIPT = f"""#!/bin/bash
#SBATCH -N2 -n2 -o sig-%j.out --open-mode=append -t 5:00
export PATH="{BIN}:$PATH"
echo ready
srun -l -o 'task-%j-%t.out' bash -c 'trap "echo usr1 \\$SLURM_PROCID" USR1
  trap "echo term \\$SLURM_PROCID" TERM; echo start $SLURM_RESTART_COUNT
  for i in $(seq 30); do sleep 0.1; done; echo end $SLURM_PROCID'
echo "srun=$?"
"""

WORDS = ("start", "usr1", "term", "end")


def test_scancel_signal_reaches_every_task_through_srun_and_the_step_runs_on(cli: Cli) -> None:
    job = cli.sbatch(SCRIPT)
    out = cli.workdir / f"sig-{job}.out"
    wait_for_line(out, "ready")
    tasks = [cli.workdir / f"task-{job}-{t}.out" for t in (0, 1)]
    for path in tasks:
        wait_for_line(path, "start")
    for sig in ("USR1", "TERM"):
        assert cli("scancel", "-s", sig, str(job)).returncode == 0
    assert cli.wait_state(job, ("COMPLETED", "FAILED"), timeout=60) == "COMPLETED|0:0"
    for task, path in enumerate(tasks):
        # (bash's reports of its sleeps killed by the signals, "Terminated", ... are skipped)
        lines = [line for line in path.read_text().splitlines() if line.split()[0] in WORDS]
        # Once each, then the task ran to its end: the step was not killed (it lasts over the agents' poll).
        assert sorted(lines) == sorted(["start 0", f"usr1 {task}", f"term {task}", f"end {task}"]), lines
    assert out.read_text().splitlines() == ["ready", "srun=0"]


def test_srun_appends_in_a_job_submitted_with_open_mode_append(cli: Cli) -> None:
    log = cli.workdir / "appended.out"
    log.write_text("before\n")
    script = f"""#!/bin/bash
#SBATCH -o /dev/null --open-mode=append
{BIN}/srun -o {log} echo "mode $SLURM_OPEN_MODE"
"""
    job = cli.sbatch(script)
    assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    assert log.read_text() == "before\nmode a\n"
