"""scancel -s reaches the tasks of a job's steps on every node, once, and only them (-b: the batch shell,
-f: the shell, its children and the steps), as in Slurm; steps outlive the agents' poll; srun appends to its
files in a job submitted with --open-mode=append."""

from __future__ import annotations

import pytest
from e2e_cli import BIN, Cli, wait_for_line

pytestmark = pytest.mark.e2e

#: Two tasks on two nodes note USR1 and TERM and end after 3 s; the batch shell reports srun's status (its own
#: traps would show a signal that reached it).
SCRIPT = f"""#!/bin/bash
#SBATCH -N2 -n2 -o sig-%j.out --open-mode=append -t 5:00
export PATH="{BIN}:$PATH"
trap 'echo batch-usr1' USR1
trap 'echo batch-term' TERM
echo ready
srun -l -o 'task-%j-%t.out' bash -c 'trap "echo usr1 \\$SLURM_PROCID" USR1
  trap "echo term \\$SLURM_PROCID" TERM; echo start $SLURM_RESTART_COUNT
  for i in $(seq 30); do sleep 0.1; done; echo end $SLURM_PROCID'
echo "srun=$?"
"""

WORDS = ("start", "usr1", "term", "end")


def test_scancel_signal_reaches_every_task_once_and_the_step_runs_on(cli: Cli) -> None:
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
    assert out.read_text().splitlines() == ["ready", "srun=0"]  # nothing reached the batch shell


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


#: The batch shell and a child it started without srun note the signals they get; a step task too.
SCOPES = f"""#!/bin/bash
#SBATCH -o scope-%j.out -t 5:00
export PATH="{BIN}:$PATH"
bash -c 'for s in USR1 USR2 HUP; do trap "echo child-$s" $s; done; echo child-ready
  while :; do sleep 0.1; done' &
srun -o 'scope-%j-step.out' bash -c 'for s in USR1 USR2 HUP; do trap "echo step-$s" $s; done
  echo step-ready; while :; do sleep 0.1; done' &
for s in USR1 USR2 HUP; do trap "echo batch-$s" $s; done
echo batch-ready
while :; do sleep 0.1; done
"""


def test_scancel_signal_scopes_steps_batch_and_full(cli: Cli) -> None:
    job = cli.sbatch(SCOPES)
    out, step = cli.workdir / f"scope-{job}.out", cli.workdir / f"scope-{job}-step.out"
    for path, word in ((out, "batch-ready"), (out, "child-ready"), (step, "step-ready")):
        wait_for_line(path, word)
    # Default: the step's tasks only; -b: the batch shell only; -f: the shell, its child and the step.
    for options in (("-s", "USR1"), ("-b", "-s", "USR2"), ("-f", "-s", "HUP")):
        assert cli("scancel", *options, str(job)).returncode == 0
    wait_for_line(step, "step-HUP")
    wait_for_line(out, "child-HUP")
    assert cli("scancel", str(job)).returncode == 0
    cli.wait_state(job, ("CANCELLED",), timeout=60)
    batch = sorted(line for line in out.read_text().split() if line.startswith(("batch-", "child-")))
    assert batch == ["batch-HUP", "batch-USR2", "batch-ready", "child-HUP", "child-ready"], batch
    tasks = [line for line in step.read_text().split() if line.startswith("step-")]
    # -f reaches the task directly and through srun, which passes the shell's signals on (as Slurm's srun).
    assert tasks[0] == "step-ready" and set(tasks[1:]) == {"step-USR1", "step-HUP"}, tasks
    assert tasks.count("step-USR1") == 1, tasks
