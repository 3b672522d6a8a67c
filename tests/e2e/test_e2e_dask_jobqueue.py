"""dask-jobqueue (the released package, unmodified) against a local cluster of real processes: each dask
worker is a batch job (``#SBATCH -J dask-worker -n 1 --cpus-per-task=1 --mem=954M -t 00:05:00``) that
connects back to the scheduler in this process; closing the cluster scancels the jobs."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_cli import Cli

dask_jobqueue = pytest.importorskip("dask_jobqueue")
distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.e2e


def worker_jobs(cli: Cli) -> list[str]:
    """``id state`` of the dask workers' jobs in squeue."""
    out = cli("squeue", "-h", "-n", "dask-worker", "-o", "%i %T")
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:-1]


def test_workers_run_as_jobs_and_end_with_the_cluster(slurm_env: Path, cli: Cli) -> None:
    cluster = dask_jobqueue.SLURMCluster(
        cores=1,
        memory="1GB",
        processes=1,
        walltime="00:05:00",
        log_directory=str(slurm_env / "logs"),
        scheduler_options={"host": "127.0.0.1"},
    )
    try:
        cluster.scale(2)
        with distributed.Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            jobs = worker_jobs(cli)
            assert len(jobs) == 2 and all(job.endswith(" RUNNING") for job in jobs), jobs
            # A builtin: the workers unpickle it without importing this module.
            squares = client.map(pow, range(10), [2] * 10)
            assert sum(f.result(timeout=60) for f in squares) == 285
    finally:
        cluster.close()
    ids = [job.split()[0] for job in jobs]
    for job_id in ids:
        # scancel'ed by the cluster's close (CANCELLED by <uid>), or ended by their own --death-timeout.
        row = cli.wait_state(int(job_id), ("CANCELLED", "COMPLETED", "FAILED"), timeout=30)
        assert row.split("|")[0].split()[0] in ("CANCELLED", "COMPLETED"), row
    deadline = time.monotonic() + 30
    while any(job.endswith(" RUNNING") for job in worker_jobs(cli)):
        assert time.monotonic() < deadline
        time.sleep(0.3)
