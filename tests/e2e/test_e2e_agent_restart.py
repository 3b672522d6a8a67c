"""Agent restarts lose nothing: runs and srun steps outlive their agent under their supervisors and are
re-adopted; duplicate launches run nothing twice."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from agent_cluster import agent_cluster, launch_orders, republish, wait_until
from e2e_cli import BIN, Cli, alive

from corral.cli.local_cluster import LocalCluster
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
    job = cli.sbatch("#!/bin/bash\necho started\nsleep 2\nexit 7\n", "-w", "node1", "-o", "ends.out")
    # The script's own line, not sacct's RUNNING (the allocation): an agent stopped before it started the
    # supervisor leaves no run to end while it is down (CI saw that under load).
    out = cli.workdir / "ends.out"
    wait_until(lambda: out.exists() and "started" in out.read_text(), timeout=30, what="the script started")
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


def restart(cluster: LocalCluster, agent: str, crash: bool = False) -> None:
    """Stop an agent (SIGTERM, or SIGKILL as a crash: its jobs and steps keep running) and start it again."""
    if crash:
        cluster.kill(agent)
    else:
        cluster.terminate(agent)
    time.sleep(0.5)
    cluster.revive(agent)


def task_pids(workdir: Path, job: int) -> list[int]:
    """The pids the step's two tasks wrote (``pid-<job>-<task>``), once both are there."""
    files = [workdir / f"pid-{job}-{t}" for t in (0, 1)]
    wait_until(lambda: all(f.exists() and f.read_text().strip() for f in files), what="tasks started")
    return [int(f.read_text()) for f in files]


def test_a_peer_agent_restart_keeps_its_step_tasks_and_reports_their_end(
    restart_cluster: tuple[LocalCluster, Cli],
) -> None:
    """A step over both nodes: the batch node's task ends at once, the peer's runs on. The peer's agent
    stops; its task outlives it (under its step supervisor), writes its last output and ends while no
    agent runs there. The restarted agent finds both on disk: srun gets the output and the exit, the step
    completes."""
    cluster, cli = restart_cluster
    out = cli.workdir / "peer.out"
    job = cli.sbatch(
        f"#!/bin/bash\nexport PATH={BIN}:$PATH\n"
        "srun -N2 -n2 bash -c 'echo $$ > pid-$SLURM_JOB_ID-$SLURM_PROCID\n"
        "  [ $SLURM_NODEID = 0 ] || { sleep 3; echo done-$SLURM_NODEID; }'\n"
        'echo "srun=$?"\n',
        "-N2",
        "-t",
        "10:00",
        "-o",
        str(out),
    )
    _, peer_task = task_pids(cli.workdir, job)
    cluster.terminate("agent-node2")
    wait_until(
        lambda: not alive(peer_task), timeout=20, what="the peer's task ended while its agent was down"
    )
    cluster.revive("agent-node2")
    assert cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=60) == "COMPLETED|0:0"
    steps = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
    assert f"{job}.0|COMPLETED|0:0" in steps, steps
    assert out.read_text().splitlines() == ["done-1", "srun=0"]


LINES = 60  # each task prints one every 0.2 s: ~12 s


def test_a_step_survives_restarts_of_both_its_agents(restart_cluster: tuple[LocalCluster, Cli]) -> None:
    """``srun -N2 -n2`` whose tasks print a numbered line every 0.2 s: the peer's agent crashes (SIGKILL)
    and restarts, then the batch node's (the step's coordinator) restarts, while it runs. srun prints
    every line of both tasks (a restart may repeat a few, none is lost), exits 0, the step completes, and
    ``scancel -s USR1`` after the restarts reaches both tasks."""
    cluster, cli = restart_cluster
    out = cli.workdir / "both.out"
    job = cli.sbatch(
        f"#!/bin/bash\nexport PATH={BIN}:$PATH\n"
        "srun -l -N2 -n2 bash -c 'echo $$ > pid-$SLURM_JOB_ID-$SLURM_PROCID\n"
        '  trap "echo t$SLURM_PROCID usr1" USR1\n'
        f"  for i in $(seq 1 {LINES}); do echo t$SLURM_PROCID $i; sleep 0.2; done'\n"
        'echo "srun=$?"\n',
        "-N2",
        "-t",
        "10:00",
        "-o",
        str(out),
    )
    pids = task_pids(cli.workdir, job)
    wait_until(lambda: "1: t1 2" in out.read_text(), what="both tasks print")
    restart(cluster, "agent-node2", crash=True)
    time.sleep(1)
    restart(cluster, "agent-node1")
    time.sleep(1)
    assert all(alive(p) for p in pids), "the tasks outlived their agents"
    assert cli("scancel", "-s", "USR1", str(job)).returncode == 0
    assert cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=60) == "COMPLETED|0:0"
    lines = out.read_text().splitlines()
    assert lines[-1] == "srun=0", lines[-5:]
    for task in (0, 1):
        numbers = {
            int(x.split()[-1]) for x in lines if x.startswith(f"{task}: t{task} ") and x.split()[-1].isdigit()
        }
        assert numbers == set(range(1, LINES + 1)), (task, sorted(set(range(1, LINES + 1)) - numbers))
        assert f"{task}: t{task} usr1" in lines, lines
    steps = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
    assert f"{job}.0|COMPLETED|0:0" in steps, steps


def test_a_job_cancelled_after_agent_restarts_kills_its_step_tasks_on_both_nodes(
    restart_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = restart_cluster
    job = cli.sbatch(
        f"#!/bin/bash\nexport PATH={BIN}:$PATH\n"
        "srun -N2 -n2 bash -c 'echo $$ > pid-$SLURM_JOB_ID-$SLURM_PROCID; exec sleep 300'\n",
        "-N2",
        "-t",
        "10:00",
        "-o",
        "cancelled.out",
    )
    pids = task_pids(cli.workdir, job)
    restart(cluster, "agent-node1")
    restart(cluster, "agent-node2")
    time.sleep(1)
    assert all(alive(p) for p in pids)
    assert cli("scancel", str(job)).returncode == 0
    assert cli.wait_state(job, ("CANCELLED", "COMPLETED", "FAILED"), timeout=60).startswith("CANCELLED")
    wait_until(lambda: not any(alive(p) for p in pids), timeout=30, what="the step's tasks were killed")
    steps = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State").stdout.split()
    assert f"{job}.0|CANCELLED" in steps, steps


def test_task_zero_reads_end_of_file_after_its_agent_restarts(
    restart_cluster: tuple[LocalCluster, Cli],
) -> None:
    """srun's stdin reaches task 0 down a pipe its agent holds: a restarted agent no longer has it, and the
    task reads end of file (documented), then goes on."""
    cluster, cli = restart_cluster
    out = cli.workdir / "stdin.out"
    job = cli.sbatch(
        f"#!/bin/bash\nexport PATH={BIN}:$PATH\n"
        "srun -n1 bash -c 'cat; echo got-eof' < <(exec sleep 300)\n"
        'echo "srun=$?"\n',
        "-w",
        "node1",
        "-o",
        str(out),
    )
    pids = cluster.state_dir / "agents" / "node1" / "stepd" / f"{job}.0.0" / "pids"
    wait_until(pids.exists, what="the step started")
    restart(cluster, "agent-node1")
    # Long before srun's stdin (a sleep of 300 s) would have ended.
    assert cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=40) == "COMPLETED|0:0"
    assert out.read_text().splitlines() == ["got-eof", "srun=0"]


def test_stopping_the_local_cluster_kills_its_jobs(tmp_path: Path) -> None:
    with agent_cluster(tmp_path) as (cluster, cli):
        job = cli.sbatch(
            f"#!/bin/bash\nexport PATH={BIN}:$PATH\n"
            "srun -N2 -n2 bash -c 'echo $$ > pid-$SLURM_JOB_ID-$SLURM_PROCID; exec sleep 300'\n",
            "-N2",
            "-o",
            "stop.out",
        )
        cli.wait_state(job, ("RUNNING",))
        tasks = task_pids(cli.workdir, job)
        pids = next((cluster.state_dir / "agents").glob(f"*/jobs/{job}.0/pids"))
        script_pid = json.loads(pids.read_text())["tasks"]["0"][0]  # the batch step's task 0: the script
    assert not Path(f"/proc/{script_pid}").exists()
    assert not any(alive(p) for p in tasks), "srun's tasks outlived corral up"
    assert (pids.parent / "killed").exists()
