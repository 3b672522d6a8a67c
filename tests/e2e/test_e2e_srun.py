"""End to end: srun steps inside sbatch jobs and srun outside an allocation, on 2 nodes x 4 GPUs."""

from __future__ import annotations

import re
import time

import pytest
from e2e_cli import BIN, Cli

pytestmark = pytest.mark.e2e

# Jobs run with the submitter's environment: make sure they find this checkout's srun.
PATH_LINE = f'export PATH="{BIN}:$PATH"\n'


def run_job(cli: Cli, body: str, *options: str) -> tuple[int, str, str]:
    """Submit ``body`` as a batch script, wait for its end; (job id, sacct row, its output)."""
    script = "#!/bin/bash\n#SBATCH -o out-%j.txt\n" + PATH_LINE + body
    job = cli.sbatch(script, *options)
    row = cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"))
    return job, row, (cli.workdir / f"out-{job}.txt").read_text()


def test_srun_runs_labelled_ranks_on_both_nodes(cli: Cli) -> None:
    body = (
        "srun -N2 -n4 -l bash -c 'echo $(hostname) $SLURMD_NODENAME $SLURM_PROCID $SLURM_LOCALID "
        "$SLURM_NODEID $SLURM_NTASKS $SLURM_STEP_ID $SLURM_STEP_NUM_TASKS $SLURM_STEP_NODELIST'\n"
    )
    _job, row, out = run_job(cli, body, "-N2", "-n4")
    assert row == "COMPLETED|0:0", out
    lines = sorted(line for line in out.splitlines() if re.match(r"^\d: ", line))
    assert len(lines) == 4, out
    seen = []
    for line in lines:
        label, rest = line.split(": ", 1)
        _host, node, procid, localid, nodeid, ntasks, step, step_tasks, step_nodes = rest.split()
        assert label == procid
        assert (ntasks, step, step_tasks, step_nodes) == ("4", "0", "4", "node[1-2]")
        seen.append((procid, node, localid, nodeid))
    assert seen == [
        ("0", "node1", "0", "0"),
        ("1", "node1", "1", "0"),
        ("2", "node2", "0", "1"),
        ("3", "node2", "1", "1"),
    ]


def test_gpus_per_task_gives_each_task_its_own_gpus(cli: Cli) -> None:
    body = "srun -n4 --gpus-per-task=1 bash -c 'echo gpu $SLURM_PROCID $CUDA_VISIBLE_DEVICES'\n"
    _job, row, out = run_job(cli, body, "-N1", "-n4", "--gres=gpu:4")
    assert row == "COMPLETED|0:0", out
    gpus = [line.split()[2] for line in out.splitlines() if line.startswith("gpu ")]
    assert len(gpus) == 4 and len(set(gpus)) == 4, out


def test_worst_task_exit_is_srun_status_and_steps_show_in_sacct(cli: Cli) -> None:
    body = "srun -n2 bash -c 'exit $((SLURM_PROCID * 3))'\necho first=$?\nsrun -n1 true\necho second=$?\n"
    job, row, out = run_job(cli, body, "-n2")
    assert row == "COMPLETED|0:0", out
    assert "first=3" in out and "second=0" in out
    assert "task 1: Exited with exit code 3" in out

    def steps() -> str:
        result = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode,NTasks")
        return result.stdout

    deadline_rows = [f"{job}.batch|COMPLETED|0:0|1", f"{job}.0|FAILED|3:0|2", f"{job}.1|COMPLETED|0:0|1"]
    for _ in range(50):
        if all(r in steps() for r in deadline_rows):
            break
        time.sleep(0.2)
    assert all(r in steps() for r in deadline_rows), steps()


def test_srun_output_patterns_and_stdin_to_task_zero(cli: Cli) -> None:
    body = "echo from-stdin | srun -n2 -o step-%J-%t.txt bash -c 'cat; echo task $SLURM_PROCID'\n"
    job, row, out = run_job(cli, body, "-n2")
    assert row == "COMPLETED|0:0", out
    assert (cli.workdir / f"step-{job}.0-0.txt").read_text() == "from-stdin\ntask 0\n"
    assert (cli.workdir / f"step-{job}.0-1.txt").read_text() == "task 1\n"


def test_srun_outside_an_allocation_allocates_runs_and_releases(cli: Cli) -> None:
    result = cli("srun", "-N2", "--gres=gpu:1", "-l", "bash", "-c", "echo hi $SLURM_PROCID")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["0: hi 0", "1: hi 1"]
    failed = cli("srun", "sh", "-c", "echo out; exit 7")
    assert failed.returncode == 7 and failed.stdout == "out\n", failed.stderr
    # srun is back once its step ended; the job's end reaches accounting's projection a little later.
    deadline = time.monotonic() + 30
    while True:
        jobs = cli("sacct", "-P", "-n", "-X", "-o", "JobID,JobName,State,ExitCode").stdout.splitlines()
        mine = [line for line in jobs if "|bash|" in line or "|sh|" in line]
        done = any(line.endswith("|COMPLETED|0:0") and "|bash|" in line for line in mine)
        failed_7 = any(line.endswith("|FAILED|7:0") and "|sh|" in line for line in mine)
        if (done and failed_7) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert done and failed_7, mine


@pytest.mark.parametrize(
    ("argv", "first", "status"),
    [
        (["srun"], "srun: error: No command given", 1),
        (["srun", "-n", "zero", "true"], 'srun: error: Invalid numeric value "zero" for --ntasks.', 1),
        (["srun", "--bogus", "true"], "srun: unrecognized option '--bogus'", 255),
        (["srun", "--pty", "true"], "srun: error: option --pty", 1),
    ],
    ids=["no-command", "bad-count", "unknown-option", "unsupported-option"],
)
def test_bad_srun_options_fail_slurm_style(cli: Cli, argv: list[str], first: str, status: int) -> None:
    """Slurm's first line and exit status (slurm-compatibility.md, Option errors)."""
    result = cli(*argv)
    assert result.returncode == status, result.stderr
    assert result.stderr.startswith(first), result.stderr
    assert result.stdout == ""


def test_srun_step_larger_than_the_job_is_refused(cli: Cli) -> None:
    _job, _row, out = run_job(cli, "srun -N3 true\necho status=$?\n", "-N2")
    assert "status=1" in out and "Unable to create step" in out, out


def test_salloc_runs_a_command_with_the_job_and_srun_inside_uses_it(cli: Cli) -> None:
    command = f"echo job=$SLURM_JOB_ID nodes=$SLURM_JOB_NODELIST; {BIN}/srun -l hostname; exit 4"
    result = cli("salloc", "-N2", "sh", "-c", command)
    assert result.returncode == 4, result.stderr
    first, *ranks = result.stdout.splitlines()
    job = first.split()[0].removeprefix("job=")
    assert first.endswith("nodes=node[1-2]") and sorted(line[:3] for line in ranks) == ["0: ", "1: "]
    assert "Granted job allocation" in result.stderr
    assert cli.wait_state(int(job), ("COMPLETED", "FAILED")) == "FAILED|4:0"


def test_tasks_that_cannot_start_are_reported_slurm_style(cli: Cli) -> None:
    """Each node's step supervisor reports a task it cannot start (no such command, no such directory, an
    output file it cannot open) with exit code 2 and why; srun exits 2."""
    body = (
        "srun -N2 -n2 /no/such/command; echo srun=$?\n"
        "srun -N2 -n2 -D /no/such/dir true; echo srun=$?\n"
        "srun -n1 -o /proc/no/such/file true; echo srun=$?\n"
    )
    _job, row, out = run_job(cli, body, "-N2", "-n2")
    assert row == "COMPLETED|0:0", out
    lines = out.splitlines()
    for task, node in ((0, "node1"), (1, "node2")):
        assert (
            f"srun: error: {node}: task {task}: execve(): /no/such/command: No such file or directory"
            in lines
        )
        assert f"srun: error: {node}: task {task}: chdir(/no/such/dir): No such file or directory" in lines
    assert any(line.startswith("srun: error: node1: task 0: open(/proc/no/such/file): ") for line in lines), (
        out
    )
    assert [line for line in lines if line.startswith("srun=")] == ["srun=2"] * 3, out
