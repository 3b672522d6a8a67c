"""simple-slurm (the released package, unmodified) against a local cluster of real processes: it submits
through ``sbatch << EOF`` with its options as ``#SBATCH --key value`` lines (``--parsable`` among them),
reads the queue with ``squeue --me -o <CSV>`` and cancels with ``scancel``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_cli import Cli

simple_slurm = pytest.importorskip("simple_slurm")

pytestmark = pytest.mark.e2e


def test_parsable_array_submission_runs_every_task(slurm_env: Path, cli: Cli) -> None:
    Slurm = simple_slurm.Slurm
    slurm = Slurm(
        job_name="simple",
        output=f"simple_{Slurm.JOB_ARRAY_MASTER_ID}_{Slurm.JOB_ARRAY_ID}.out",
        array=range(3),
        cpus_per_task=1,
        time="0:05:00",
        open_mode="append",
        parsable=True,
    )
    job_id = slurm.sbatch("echo task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID", verbose=False)
    assert isinstance(job_id, int)
    deadline = time.monotonic() + 60
    rows: list[str] = []
    while time.monotonic() < deadline:
        rows = cli("sacct", "-j", str(job_id), "-X", "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
        if len(rows) == 3 and all(row.split("|")[1] not in ("PENDING", "RUNNING") for row in rows):
            break
        time.sleep(0.3)
    assert rows == [f"{job_id}_{task}|COMPLETED|0:0" for task in range(3)], rows
    for task in range(3):
        out = slurm_env / f"simple_{job_id}_{task}.out"
        assert out.read_text() == f"task {task} of {job_id}\n"


def test_plain_submission_squeue_and_cancel(slurm_env: Path, cli: Cli) -> None:
    slurm = simple_slurm.Slurm(job_name="simple-long", ntasks=2, time=5, output="long_%j.out")
    # Without --parsable simple-slurm reads the id from "Submitted batch job N".
    job_id = slurm.sbatch("srun -l echo hi; sleep 300", verbose=False)
    cli.wait_state(job_id, ("RUNNING",))
    slurm.squeue.update_squeue()
    row = slurm.squeue.jobs[job_id]
    assert (row["NAME"], row["ST"], row["CPUS"], row["NODES"]) == ("simple-long", "R", "2", "1"), row
    assert row["NODELIST(REASON)"] in ("node1", "node2"), row
    # the step's output first (a quick squeue can come before srun has run it), then the cancel
    out = slurm_env / f"long_{job_id}.out"
    deadline = time.monotonic() + 30
    while not (out.exists() and len(out.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    slurm.scancel.cancel_job(job_id)
    assert cli.wait_state(job_id, ("CANCELLED",)).startswith("CANCELLED"), job_id
    assert sorted(out.read_text().splitlines()) == ["0: hi", "1: hi"]
