"""End to end: job dependencies, holds and begin time with the real commands on the local cluster."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from e2e_cli import Cli

pytestmark = pytest.mark.e2e

Waiter = Callable[[Callable[[], bool], float], None]

STAMP = "#!/bin/sh\ndate +%s.%N > {name}.start\nsleep {sleep}\ndate +%s.%N > {name}.end\n"


def reason(cli: Cli, job: int) -> str:
    """The job's pending reason as squeue prints it (``%r``)."""
    out = cli("squeue", "-h", "-j", str(job), "-o", "%r")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def stamp(cli: Cli, name: str, which: str) -> float:
    """A time a job wrote with ``date +%s.%N``."""
    return float((cli.workdir / f"{name}.{which}").read_text())


def test_an_afterok_chain_runs_in_order(cli: Cli) -> None:
    first = cli.sbatch(STAMP.format(name="chain1", sleep=1))
    second = cli.sbatch(STAMP.format(name="chain2", sleep=1), f"--dependency=afterok:{first}")
    third = cli.sbatch(STAMP.format(name="chain3", sleep=0), "-d", f"afterok:{second}")
    for job in (first, second, third):
        assert cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED")) == "COMPLETED|0:0"
    assert stamp(cli, "chain1", "end") <= stamp(cli, "chain2", "start")
    assert stamp(cli, "chain2", "end") <= stamp(cli, "chain3", "start")


def test_afternotok_on_a_successful_job_is_never_satisfied(cli: Cli, wait_for: Waiter) -> None:
    ok = cli.sbatch("#!/bin/sh\ntrue\n")
    waiting = cli.sbatch("#!/bin/sh\ntrue\n", f"--dependency=afternotok:{ok}")
    assert cli.wait_state(ok, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    wait_for(lambda: reason(cli, waiting) == "DependencyNeverSatisfied", 15.0)
    # It stays pending, as in Slurm (accounting follows the log a moment later: wait for it).
    wait_for(lambda: cli.sacct(waiting) == "PENDING|0:0", 15.0)
    assert cli("scancel", str(waiting)).returncode == 0
    cli.wait_state(waiting, ("CANCELLED",))


def test_a_held_job_runs_once_released(cli: Cli, wait_for: Waiter) -> None:
    job = cli.sbatch("#!/bin/sh\necho released\n", "-H")
    wait_for(lambda: reason(cli, job) == "JobHeldUser", 15.0)
    time.sleep(1.0)
    wait_for(lambda: cli.sacct(job) == "PENDING|0:0", 15.0)  # still pending (once accounting has it)
    out = cli("scontrol", "release", str(job))
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    # A finished job can no longer be held, with Slurm's words.
    out = cli("scontrol", "hold", str(job))
    assert out.returncode == 1
    assert out.stderr == f"scontrol: error: Job/step already completing or completed for job {job}\n"


def test_scontrol_hold_keeps_a_pending_job_from_starting(cli: Cli, wait_for: Waiter) -> None:
    blocker = cli.sbatch("#!/bin/sh\nsleep 2\n", "-N", "2", "--gres=gpu:4")
    job = cli.sbatch("#!/bin/sh\ntrue\n", "--gres=gpu:1", f"--dependency=afterany:{blocker}")
    assert cli("scontrol", "hold", str(job)).returncode == 0
    wait_for(lambda: reason(cli, job) == "JobHeldUser", 15.0)
    cli.wait_state(blocker, ("COMPLETED",))
    time.sleep(1.0)
    assert reason(cli, job) == "JobHeldUser"
    assert cli("scontrol", "release", str(job)).returncode == 0
    assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"


def test_begin_time_delays_the_start(cli: Cli, wait_for: Waiter) -> None:
    submitted = time.time()
    job = cli.sbatch(STAMP.format(name="begin", sleep=0), "--begin=now+3")
    wait_for(lambda: reason(cli, job) == "BeginTime", 2.5)
    assert cli.wait_state(job, ("COMPLETED", "FAILED"), timeout=30) == "COMPLETED|0:0"
    assert stamp(cli, "begin", "start") >= submitted + 3


def test_scontrol_show_job_prints_slurm_fields(cli: Cli, wait_for: Waiter) -> None:
    first = cli.sbatch("#!/bin/sh\ntrue\n", "-H", "-J", "shown-first")
    job = cli.sbatch(
        "#!/bin/sh\ntrue\n", "-J", "shown", "-t", "10", "-o", "out-%j.txt", "-d", f"afterok:{first}"
    )
    wait_for(lambda: reason(cli, job) == "Dependency", 15.0)
    out = cli("scontrol", "show", "job", str(job))
    assert out.returncode == 0, out.stderr
    fields = dict(word.split("=", 1) for word in out.stdout.split() if "=" in word)
    assert fields["JobId"] == str(job) and fields["JobName"] == "shown"
    assert (fields["JobState"], fields["Reason"]) == ("PENDING", "Dependency")
    assert fields["Dependency"] == f"afterok:{first}(unfulfilled)"
    assert (fields["NumNodes"], fields["NumCPUs"], fields["TimeLimit"]) == ("1", "1", "00:10:00")
    assert fields["StdOut"] == str(cli.workdir / f"out-{job}.txt")
    assert fields["WorkDir"] == str(cli.workdir)
    for key in ("UserId", "Account", "SubmitTime", "StartTime", "Partition", "NodeList"):
        assert key in fields, key
    assert out.stdout.startswith(f"JobId={job} JobName=shown\n   UserId=")
    missing = cli("scontrol", "show", "job", "999999")
    assert (missing.returncode, missing.stderr) == (
        1,
        "scontrol: error: slurm_load_jobs error: Invalid job id specified\n",
    )
    for victim in (first, job):
        assert cli("scancel", str(victim)).returncode == 0


def test_a_dependency_on_a_job_that_does_not_exist_is_refused(cli: Cli) -> None:
    out = cli("sbatch", "--parsable", "-d", "afterok:999999", stdin="#!/bin/sh\ntrue\n")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == "sbatch: error: Batch job submission failed: Job dependency problem\n"


def test_scontrol_update_changes_a_pending_job(cli: Cli, wait_for: Waiter) -> None:
    job = cli.sbatch("#!/bin/sh\ntrue\n", "-H", "-t", "30")
    out = cli("scontrol", "update", f"JobId={job}", "TimeLimit=5")
    assert (out.returncode, out.stderr) == (0, "")
    wait_for(lambda: "TimeLimit=00:05:00" in cli("scontrol", "show", "job", str(job)).stdout, 15.0)
    # A user may lower a time limit, not raise it (as in Slurm); the partition must exist.
    out = cli("scontrol", "update", f"JobId={job}", "TimeLimit=1:00:00")
    assert (out.returncode, out.stderr) == (1, f"scontrol: error: Access/permission denied for job {job}\n")
    out = cli("scontrol", "update", f"JobId={job}", "Partition=nosuch")
    assert out.returncode == 1 and out.stderr.startswith(
        "scontrol: error: Invalid partition name specified: partition 'nosuch' does not exist"
    ), out.stderr
    assert cli("scancel", str(job)).returncode == 0
