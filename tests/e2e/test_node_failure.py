"""A node stops heartbeating: it goes DOWN, its job is requeued (restart count + 1) and reruns later."""

from __future__ import annotations

import getpass
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cli import Cli, job_processes, user_env

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, Cli]]:
    """A 2-node cluster of our own: this test kills agents."""
    cluster = LocalCluster(tmp_path / "state", getpass.getuser(), nodes=2, gpus_per_node=2)
    cluster.prepare()
    cluster.start(ready_timeout=90)
    env = user_env(cluster.state_dir)
    try:
        yield cluster, Cli(env=env, workdir=tmp_path)
    finally:
        cluster.stop()


def node_states(cli: Cli) -> dict[str, str]:
    """sinfo -N: node -> state."""
    out = cli("sinfo", "-N", "-h", "-o", "%N %t").stdout.split()
    return dict(zip(out[::2], out[1::2], strict=True))


def test_a_lost_node_requeues_its_job_which_reruns_with_restart_count_1(
    own_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = own_cluster
    script = (
        "#!/bin/bash\n#SBATCH -N 2 --gres=gpu:2 --open-mode=append -o run.out\n"
        "echo attempt $SLURM_RESTART_COUNT on $SLURM_JOB_NODELIST\nsleep 600\n"
    )
    job = cli.sbatch(script)
    cli.wait_state(job, ("RUNNING",))
    cluster.kill("agent-node2")  # node2 stops heartbeating; the batch script runs on node1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not node_states(cli).get("node2", "").startswith("down"):
        time.sleep(0.3)
    assert node_states(cli)["node2"].startswith("down")
    # The whole run ends (gang): the job is back in the queue, waiting for two nodes.
    row = cli.wait_state(job, ("PENDING",), timeout=30)
    assert row == "PENDING|0:0"
    queue = cli("squeue", "-h", "-j", str(job), "-o", "%T %r").stdout.strip()
    assert queue == "PENDING Resources", queue
    cluster.revive("agent-node2")
    cli.wait_state(job, ("RUNNING",), timeout=30)
    output = cli.workdir / "run.out"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and "attempt 1" not in output.read_text():
        time.sleep(0.2)
    assert output.read_text().splitlines() == ["attempt 0 on node[1-2]", "attempt 1 on node[1-2]"]
    # The first run's script was killed on node1: only attempt 1's processes are left.
    assert attempts_running(job) == {"1"}
    assert cli("scancel", str(job)).returncode == 0
    assert cli.wait_state(job, ("CANCELLED",)).startswith("CANCELLED")


def attempts_running(job: int) -> set[str]:
    """SLURM_RESTART_COUNT of every live process of the job, its supervisors included."""
    return {attempt for _, _, attempt in job_processes(job)}
