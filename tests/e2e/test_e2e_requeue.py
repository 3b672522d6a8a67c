"""scontrol requeue from inside a job, and scancel --signal, against a local cluster of real processes."""

from __future__ import annotations

import pytest
from e2e_cli import BIN, Cli, wait_for_line

pytestmark = pytest.mark.e2e

#: Requeues itself in its first run (scontrol must return 0 at once), is killed, and completes in its second;
#: its output is appended across the runs. The requeue's SIGTERM may come before scontrol has exited (it
#: goes to every process of the job): scontrol ignores it here so that its status is seen.
REQUEUE_ITSELF = f"""#!/bin/bash
#SBATCH -J rq --open-mode=append -o rq-%j.out -t 5:00
echo "start $SLURM_RESTART_COUNT"
if [ "$SLURM_RESTART_COUNT" = 0 ]; then
  trap 'echo term; exit 0' TERM
  ( trap '' TERM; {BIN}/scontrol requeue "$SLURM_JOB_ID"; echo "rc $?" )
  sleep 120 &
  wait
  echo "done 0"
fi
echo "done $SLURM_RESTART_COUNT"
"""


def test_a_job_requeues_itself_and_reruns_with_the_same_id_and_appended_output(cli: Cli) -> None:
    job = cli.sbatch(REQUEUE_ITSELF)
    out = cli.workdir / f"rq-{job}.out"
    assert wait_for_line(out, "rc") == "rc 0"
    assert cli.wait_state(job, ("COMPLETED",), timeout=90) == "COMPLETED|0:0"
    lines = out.read_text().splitlines()
    # Its first run exited 0 on SIGTERM: a requested requeue is still a requeue.
    assert lines == ["start 0", "rc 0", "term", "start 1", "done 1"], lines
    shown = cli("scontrol", "show", "job", str(job)).stdout
    assert "Restarts=1" in shown, shown


#: Runs an srun step in each run (named after the run) and requeues itself in its first, as REQUEUE_ITSELF.
REQUEUE_AFTER_A_STEP = f"""#!/bin/bash
#SBATCH -J rqs --open-mode=append -o rqs-%j.out -t 5:00
{BIN}/srun -J "step$SLURM_RESTART_COUNT" echo "step $SLURM_RESTART_COUNT"
if [ "$SLURM_RESTART_COUNT" = 0 ]; then
  trap 'echo term; exit 0' TERM
  ( trap '' TERM; {BIN}/scontrol requeue "$SLURM_JOB_ID"; echo "rc $?" )
  sleep 120 &
  wait
fi
echo "done $SLURM_RESTART_COUNT"
"""


def test_sacct_duplicates_shows_each_runs_steps_under_that_run(cli: Cli) -> None:
    job = cli.sbatch(REQUEUE_AFTER_A_STEP)
    assert cli.wait_state(job, ("COMPLETED",), timeout=90) == "COMPLETED|0:0"
    out = cli.workdir / f"rqs-{job}.out"
    assert out.read_text().splitlines() == ["step 0", "rc 0", "term", "step 1", "done 1"]

    def sacct(*flags: str) -> list[str]:
        shown = cli("sacct", "-j", str(job), *flags, "-P", "-n", "-o", "JobID,JobName,State,ExitCode")
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.splitlines()

    last_run = [
        f"{job}|rqs|COMPLETED|0:0",
        f"{job}.batch|batch|COMPLETED|0:0",
        f"{job}.0|step1|COMPLETED|0:0",
    ]
    assert sacct() == last_run
    every_run = sacct("-D")
    assert every_run[:3] == [
        f"{job}|rqs|REQUEUED|0:0",
        f"{job}.batch|batch|CANCELLED|0:0",  # killed by the requeue (it exited 0 on the SIGTERM)
        f"{job}.0|step0|COMPLETED|0:0",
    ]
    assert every_run[3:] == last_run


def test_requeue_refusals_are_slurms(cli: Cli) -> None:
    held = cli.sbatch("#!/bin/bash\nsleep 1\n", "-H")
    out = cli("scontrol", "requeue", str(held))
    assert (out.returncode, out.stderr) == (1, f"scontrol: error: Job is pending execution for job {held}\n")
    fixed = cli.sbatch("#!/bin/bash\nsleep 120\n", "--no-requeue")
    cli.wait_state(fixed, ("RUNNING",))
    out = cli("scontrol", "requeue", str(fixed))
    assert out.returncode == 1
    assert out.stderr == f"scontrol: error: Requested operation is presently disabled for job {fixed}\n"
    out = cli("scontrol", "requeue", "999999")
    assert (out.returncode, out.stderr) == (1, "scontrol: error: Invalid job id specified for job 999999\n")
    assert cli("scancel", str(held), str(fixed)).returncode == 0


def test_requeuehold_requeues_the_job_held(cli: Cli) -> None:
    job = cli.sbatch("#!/bin/bash\n#SBATCH -o rqh-%j.out\necho run $SLURM_RESTART_COUNT\nsleep 120\n")
    cli.wait_state(job, ("RUNNING",))
    assert cli("scontrol", "requeuehold", str(job)).returncode == 0
    cli.wait_state(job, ("PENDING",), timeout=60)
    squeue = cli("squeue", "-h", "-j", str(job), "-o", "%T %r").stdout.strip()
    assert squeue == "PENDING JobHeldUser", squeue
    assert cli("scontrol", "release", str(job)).returncode == 0
    cli.wait_state(job, ("RUNNING",))
    # RUNNING from its allocation on: the first attempt's "run 0" stays in the file until the second one's
    # launch truncates it, then writes its own line.
    assert wait_for_line(cli.workdir / f"rqh-{job}.out", "run 1") == "run 1"
    assert cli("scancel", str(job)).returncode == 0


#: A batch shell with one step (srun); each notes the signals it gets. USR1 ends the step's task; USR2 ends
#: the batch shell with status 3.
SIGNALLED = f"""#!/bin/bash
#SBATCH -o sig-%j.out -t 5:00
trap 'echo batch-usr2; exit 3' USR2
{BIN}/srun bash -c 'trap "echo step-usr1; exit 0" USR1; trap "echo step-usr2" USR2; echo ready
  while true; do sleep 0.1; done' &
wait
echo "after $?"
"""


def test_scancel_signal_reaches_the_steps_and_leaves_the_job_running(cli: Cli) -> None:
    job = cli.sbatch(SIGNALLED)
    out = cli.workdir / f"sig-{job}.out"
    wait_for_line(out, "ready")
    done = cli("scancel", "--signal=USR1", str(job))
    assert (done.returncode, done.stderr) == (0, "")
    # The batch shell did not get USR1 (it would have died of it): its child ended, then it did.
    assert cli.wait_state(job, ("COMPLETED",), timeout=30) == "COMPLETED|0:0"
    lines = out.read_text().splitlines()
    assert "step-usr1" in lines and lines[-1] == "after 0", lines


def test_scancel_batch_signals_only_the_batch_shell(cli: Cli) -> None:
    job = cli.sbatch(SIGNALLED)
    out = cli.workdir / f"sig-{job}.out"
    wait_for_line(out, "ready")
    assert cli("scancel", "-b", "-s", "USR2", str(job)).returncode == 0
    assert cli.wait_state(job, ("FAILED",), timeout=30) == "FAILED|3:0"
    assert "step-usr2" not in out.read_text()
    assert "batch-usr2" in out.read_text()


def test_scancel_signal_of_a_pending_job_is_an_error(cli: Cli) -> None:
    held = cli.sbatch("#!/bin/bash\nsleep 1\n", "-H")
    out = cli("scancel", "-s", "USR1", str(held))
    assert out.returncode == 1
    assert out.stderr == f"scancel: error: Kill job error on job id {held}: Job is pending execution\n"
    # With filters, a signal selects running jobs only: the held job is not an error then.
    assert cli("scancel", "-s", "USR1", "--me", "-n", "nothing-runs-by-this-name").returncode == 0
    assert cli("scancel", str(held)).returncode == 0
