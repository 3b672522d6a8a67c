"""Agent restarts lose nothing: runs outlive their agent under their supervisor and are re-adopted;
duplicate launches run nothing twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from agent_cluster import agent_cluster, launch_orders, republish, wait_until
from e2e_cli import BIN, Cli

from corral.libs.local_cluster import LocalCluster
from corral.schemas.codec import encode

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def restart_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Cli]]:
    """One cluster for this module's tests (they restart agent-node1 in turn)."""
    with agent_cluster(tmp_path_factory.mktemp("restart")) as pair:
        yield pair


def test_an_agent_restart_in_the_middle_of_a_job_loses_nothing(
    restart_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = restart_cluster
    out = cli.workdir / "restart.out"
    job = cli.sbatch(
        "#!/bin/bash\necho start $SLURM_RESTART_COUNT\nsleep 5\necho done $SLURM_JOB_ID\n",
        "-w",
        "node1",
        "-o",
        str(out),
    )
    cli.wait_state(job, ("RUNNING",))
    wait_until(lambda: out.exists() and "start" in out.read_text(), what="the script started")
    cluster.terminate("agent-node1")  # SIGTERM: the agent stops, the job does not
    time.sleep(1)
    assert cli.sacct(job) == "RUNNING|0:0"
    cluster.revive("agent-node1")
    assert cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "PENDING"), timeout=30) == "COMPLETED|0:0"
    assert out.read_text().splitlines() == ["start 0", f"done {job}"]  # once, first attempt


def test_a_job_that_ends_while_its_agent_is_down_is_reported_with_its_exit_status(
    restart_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = restart_cluster
    job = cli.sbatch("#!/bin/bash\nsleep 2\nexit 7\n", "-w", "node1", "-o", "ends.out")
    cli.wait_state(job, ("RUNNING",))
    cluster.terminate("agent-node1")
    status = next((cluster.state_dir / "agents" / "node1" / "jobs").glob(f"{job}.0")) / "status"
    wait_until(status.exists, timeout=20, what="the run ended while its agent was down")
    assert cli.sacct(job) == "RUNNING|0:0"  # nobody has told the cluster yet
    cluster.revive("agent-node1")
    assert cli.wait_state(job, ("FAILED", "COMPLETED"), timeout=30) == "FAILED|7:0"


def test_the_time_limit_is_enforced_across_an_agent_restart(
    restart_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = restart_cluster
    job = cli.sbatch("#!/bin/bash\nsleep 60\n", "-w", "node1", "--time=0:06", "-o", "limit.out")
    cli.wait_state(job, ("RUNNING",))
    cluster.terminate("agent-node1")
    time.sleep(1)
    cluster.revive("agent-node1")
    started = time.monotonic()
    assert cli.wait_state(job, ("TIMEOUT", "COMPLETED", "FAILED"), timeout=30).startswith("TIMEOUT")
    assert time.monotonic() - started < 15


def test_a_duplicate_launch_runs_nothing_twice(restart_cluster: tuple[LocalCluster, Cli]) -> None:
    cluster, cli = restart_cluster
    marker = cli.workdir / "ran.txt"
    job = cli.sbatch(f"#!/bin/bash\necho ran >> {marker}\n", "-w", "node2", "-o", "dup.out")
    assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    [(order, data)] = [(o, d) for o, d in launch_orders(cluster, "node2") if o.job_id == job]
    republish(cluster, "node2", data, msg_id=f"duplicate-{job}")
    # A launch for an older attempt than one the node ran is refused (and reported, which changes nothing).
    stale = msgspec.structs.replace(order, attempt=-1)
    republish(cluster, "node2", encode(stale), msg_id=f"stale-{job}")
    # The agent handles its work in order: a later job on the node ran means both were handled.
    after = cli.sbatch("#!/bin/bash\ntrue\n", "-w", "node2", "-o", "after.out")
    assert cli.wait_state(after, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    assert marker.read_text() == "ran\n"
    assert cli.sacct(job) == "COMPLETED|0:0"


def test_a_peer_agent_restart_ends_its_step_tasks_and_the_step(
    restart_cluster: tuple[LocalCluster, Cli],
) -> None:
    """A step over both nodes: the batch node's task ends at once, the peer's runs on. The peer's agent
    restarts, which kills its tasks (steps do not survive an agent restart) without any exit reaching
    anyone: the batch node's agent learns it by polling the peer, and the step ends, long before its job."""
    cluster, cli = restart_cluster
    out = cli.workdir / "peer.out"
    job = cli.sbatch(
        f"#!/bin/bash\nexport PATH={BIN}:$PATH\n"
        "srun -N2 -n2 bash -c 'echo $$ > peer-$SLURM_JOB_ID-$SLURM_NODEID\n"
        "  [ $SLURM_NODEID = 0 ] || exec sleep 300'\n"
        'echo "srun=$?"\n',
        "-N2",
        "-t",
        "10:00",
        "-o",
        str(out),
    )
    pid_files = [cli.workdir / f"peer-{job}-{n}" for n in (0, 1)]
    wait_until(lambda: all(f.exists() and f.read_text().strip() for f in pid_files), what="tasks started")
    peer = cli("squeue", "-h", "-j", str(job), "-o", "%N").stdout.strip()
    assert peer == "node[1-2]", peer
    cluster.terminate("agent-node2")
    cluster.revive("agent-node2")
    assert cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=60) == "COMPLETED|0:0"
    steps = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
    assert f"{job}.0|FAILED|0:9" in steps, steps
    # srun exits as its worst task, killed by SIGKILL, whose exit it took from the step's record.
    assert out.read_text().splitlines() == ["srun: error: node2: task 1: Killed by signal 9", "srun=137"]


def test_stopping_the_local_cluster_kills_its_jobs(tmp_path: Path) -> None:
    with agent_cluster(tmp_path) as (cluster, cli):
        job = cli.sbatch("#!/bin/bash\nsleep 300\n", "-o", "stop.out")
        cli.wait_state(job, ("RUNNING",))
        pids = next((cluster.state_dir / "agents").glob(f"*/jobs/{job}.0/pids"))
        script_pid = int(pids.read_text().split()[2])
    assert not Path(f"/proc/{script_pid}").exists()
    assert (pids.parent / "killed").exists()
