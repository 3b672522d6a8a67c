"""QOS limits end to end: a user at MaxGRESPerUser waits with QOSMaxGRESPerUser and starts once their first
job ends; MaxSubmitJobs, an unknown QOS and a user's negative nice are refused at submit."""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cli import Cli, as_local, user_env

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.config.cluster import local_config_text

pytestmark = pytest.mark.e2e

QOS = """
[[qos]]
name = "capped"
max_gres_per_user = 4
max_submit_jobs_per_user = 2
"""


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """A 2-node x 4-GPU cluster of our own, with a QOS that caps each user at 4 GPUs and 2 jobs."""
    state = tmp_path_factory.mktemp("limits")
    cluster = LocalCluster(state / "state", getpass.getuser(), nodes=2, gpus_per_node=4)
    cluster.state_dir.mkdir(mode=0o700)
    cpus = max(os.cpu_count() or 2, 2) * 4
    text = local_config_text("local", ["node1", "node2"], 4, cpus, 64 * 1024) + QOS
    cluster.config_path.write_text(as_local(text))
    config = cluster.prepare()
    assert ensure_resolvable([n.name for n in config.nodes]) is None
    cluster.start(ready_timeout=90)
    env = user_env(cluster.state_dir)
    try:
        yield Cli(env=env, workdir=Path(state))
    finally:
        cluster.stop()


def wait_row(cli: Cli, job: int, expected: str, timeout: float = 10.0) -> str:
    """squeue's ``%T %r %q`` of the job once it is ``expected`` (or the last row seen after ``timeout``)."""
    deadline = time.monotonic() + timeout
    row = ""
    while time.monotonic() < deadline:
        row = cli("squeue", "-h", "-j", str(job), "-o", "%T %r %q").stdout.strip()
        if row == expected:
            break
        time.sleep(0.3)
    return row


def test_a_user_at_max_gres_per_user_waits_then_starts(limited: Cli) -> None:
    cli = limited
    first = cli.sbatch("#!/bin/sh\n#SBATCH -q capped --gres=gpu:4 -t 1:00\nsleep 6\n")
    cli.wait_state(first, ("RUNNING",))
    second = cli.sbatch("#!/bin/sh\n#SBATCH --qos=capped --gres=gpu:2 -o qos.out\necho qos=$SLURM_JOB_QOS\n")
    # node2's 4 GPUs are idle: only the QOS limit holds the job back.
    assert wait_row(cli, second, "PENDING QOSMaxGRESPerUser capped") == "PENDING QOSMaxGRESPerUser capped"
    # MaxSubmitJobsPerUser=2: a third job of the QOS is refused, and nothing is appended.
    third = cli("sbatch", "--parsable", "-q", "capped", "--wrap", "true")
    assert third.returncode != 0
    assert "Job violates accounting/QOS policy" in third.stderr, third.stderr
    assert cli.wait_state(first, ("COMPLETED",), timeout=30) == "COMPLETED|0:0"
    assert cli.wait_state(second, ("COMPLETED",), timeout=30) == "COMPLETED|0:0"
    ends = cli.sacct(first, "End").strip()
    starts = cli.sacct(second, "Start").strip()
    assert starts >= ends, (starts, ends)
    assert (cli.workdir / "qos.out").read_text().strip() == "qos=capped"


def test_bad_qos_and_negative_nice_are_refused(limited: Cli) -> None:
    unknown = limited("sbatch", "-q", "gold", "--wrap", "true")
    assert unknown.returncode != 0
    assert "Invalid qos specification" in unknown.stderr, unknown.stderr
    nice = limited("sbatch", "--nice=-5", "--wrap", "true")
    assert nice.returncode != 0
    assert "Access/permission denied" in nice.stderr, nice.stderr
