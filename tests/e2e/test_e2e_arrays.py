"""End to end: job arrays with a throttle, their environment and files, and cancelling tasks."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_cli import Cli

pytestmark = pytest.mark.e2e

Waiter = Callable[[Callable[[], bool], float], None]
ARRAY_VARS = (
    "$SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT $SLURM_ARRAY_TASK_MIN "
    "$SLURM_ARRAY_TASK_MAX $SLURM_ARRAY_TASK_STEP"
)


def tasks(cli: Cli, array: int) -> dict[str, tuple[str, str]]:
    """``sacct --array -j A``: JobID (``A_T``) -> (JobIDRaw, State) of every task."""
    out = cli("sacct", "--array", "-j", str(array), "-X", "-P", "-n", "-o", "JobID,JobIDRaw,State")
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines()]
    return {job: (raw, state.split(" ")[0]) for job, raw, state in rows}


def wait_tasks(
    cli: Cli, array: int, wanted: Callable[[dict[str, tuple[str, str]]], bool], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    seen: dict[str, tuple[str, str]] = {}
    while time.monotonic() < deadline:
        seen = tasks(cli, array)
        if wanted(seen):
            return
        time.sleep(0.3)
    raise AssertionError(f"array {array} not as wanted in {timeout}s: {seen}")


def states(seen: dict[str, tuple[str, str]]) -> dict[str, str]:
    return {job: state for job, (_, state) in seen.items()}


def test_a_throttled_array_runs_at_most_two_tasks_at_once(cli: Cli, tmp_path: Path, wait_for: Waiter) -> None:
    script = (
        "#!/bin/bash\n"
        f"out={tmp_path}/span.$SLURM_ARRAY_TASK_ID\n"
        f'echo "$(date +%s.%N) $SLURM_JOB_ID {ARRAY_VARS}" >> $out\n'
        "sleep 2\n"
        'echo "$(date +%s.%N)" >> $out\n'
        "echo task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID\n"
    )
    array = cli.sbatch(script, "--array=0-5%2")
    after = cli.sbatch(f"#!/bin/sh\ndate +%s.%N > {tmp_path}/after\n", f"--dependency=afterok:{array}")
    # The pending remainder is one row, waiting for the throttle, as in Slurm.
    pending = re.compile(rf"^{array}_\[[0-9]-5%2\] PD JobArrayTaskLimit$", re.M)
    wait_for(
        lambda: bool(pending.search(cli("squeue", "-h", "-j", str(array), "-o", "%i %t %r").stdout)), 10.0
    )
    wait_tasks(cli, array, lambda seen: set(states(seen).values()) == {"COMPLETED"} and len(seen) == 6, 90)
    assert tasks(cli, array) == {f"{array}_{t}": (str(array + t), "COMPLETED") for t in range(6)}
    spans = []
    for task in range(6):
        start_line, end_line = (tmp_path / f"span.{task}").read_text().split("\n")[:2]
        start, job_id, *values = start_line.split()
        assert [job_id, *values] == [str(array + task), str(array), str(task), "6", "0", "5", "1"]
        spans.append((float(start), float(end_line)))
        output = cli.workdir / f"slurm-{array}_{task}.out"
        assert output.read_text() == f"task {task} of {array}\n"
    points = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert peak == 2
    # afterok on the array's id waited for every task.
    assert cli.wait_state(after, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    assert float((tmp_path / "after").read_text()) >= max(end for _, end in spans)


def test_scancel_one_task_some_tasks_then_the_whole_array(cli: Cli, wait_for: Waiter) -> None:
    array = cli.sbatch("#!/bin/sh\nsleep 60\n", "--array=0-4%2", "-J", "sweep")
    wait_tasks(cli, array, lambda seen: states(seen).get(f"{array}_1") == "RUNNING", 30)
    show = cli("scontrol", "show", "job", f"{array}_3")
    assert show.returncode == 0, show.stderr
    assert (
        f"JobId={array + 3} ArrayJobId={array} ArrayTaskId=3 ArrayTaskThrottle=2 JobName=sweep" in show.stdout
    )
    out = cli("scancel", f"{array}_2")
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")
    wait_tasks(cli, array, lambda seen: states(seen).get(f"{array}_2") == "CANCELLED", 15)
    assert states(tasks(cli, array)) == {
        f"{array}_0": "RUNNING",
        f"{array}_1": "RUNNING",
        f"{array}_2": "CANCELLED",
        f"{array}_3": "PENDING",
        f"{array}_4": "PENDING",
    }
    # Without --array, Slurm's sacct shows the tasks that never started as one record.
    compact = cli("sacct", "-j", str(array), "-X", "-P", "-n", "-o", "JobID,State").stdout.split()
    assert f"{array}_[3-4]|PENDING" in compact and f"{array}_0|RUNNING" in compact, compact
    # A held task keeps its place in the queue but does not take a freed one.
    assert cli("scontrol", "hold", f"{array}_4").returncode == 0
    reason = ["squeue", "-h", "-r", "-j", f"{array}_4", "-o", "%r"]
    wait_for(lambda: cli(*reason).stdout.strip() == "JobHeldUser", 10.0)
    # A running task and a pending one by index.
    assert cli("scancel", f"{array}_[0,3]").returncode == 0
    wait_tasks(cli, array, lambda seen: states(seen).get(f"{array}_0") == "CANCELLED", 30)
    time.sleep(1.0)
    assert states(tasks(cli, array))[f"{array}_3"] == "CANCELLED"
    assert states(tasks(cli, array))[f"{array}_4"] == "PENDING"
    # Released, task 4 takes the place task 0 freed.
    assert cli("scontrol", "release", f"{array}_4").returncode == 0
    wait_tasks(cli, array, lambda seen: states(seen).get(f"{array}_4") == "RUNNING", 30)
    # An index the array does not have.
    out = cli("scancel", f"{array}_9")
    assert out.returncode == 1
    assert out.stderr == f"scancel: error: Kill job error on job id {array}_9: Invalid job id specified\n"
    # The array's id cancels the rest.
    assert cli("scancel", str(array)).returncode == 0
    wait_tasks(cli, array, lambda seen: set(states(seen).values()) == {"CANCELLED"}, 30)
