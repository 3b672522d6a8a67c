"""A run's processes never outlive it: on every node of a requeued or cancelled multi-node run, every process
of the run gets SIGTERM, KillWait to checkpoint, then SIGKILL; and no GPU of a node is given to the next
attempt while the previous attempt's processes live there.

Each test runs a 2-node job whose script starts ``srun payload.sh``: one task per node that traps SIGTERM,
as a training rank that checkpoints does. The payload writes ``up`` when it starts and ``TERM`` when it is
told to stop, each line naming its node, rank and attempt.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_cluster import wait_until
from e2e_cli import Cli, job_processes, user_env

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e

PAYLOAD = """#!/bin/bash
trap 'echo "TERM $SLURMD_NODENAME $SLURM_PROCID $SLURM_RESTART_COUNT" >> events.log; exit 0' TERM
echo "up $SLURMD_NODENAME $SLURM_PROCID $SLURM_RESTART_COUNT $CUDA_VISIBLE_DEVICES" >> events.log
while true; do sleep 0.2; done
"""

SCRIPT = """#!/bin/bash
#SBATCH -N 2 --gres=gpu:2 --requeue -o job.out
# a process the batch script starts itself (no srun): it must get the same SIGTERM and grace
bash -c 'trap "echo TERM batch-child - \\$SLURM_RESTART_COUNT >> events.log; exit 0" TERM
         while true; do sleep 0.2; done' &
srun -N 2 -n 2 ./payload.sh
"""


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[tuple[LocalCluster, Cli]]:
    """A 2-node cluster of our own (2 GPUs each): these tests kill agents and job processes."""
    cluster = LocalCluster(tmp_path / "state", getpass.getuser(), nodes=2, gpus_per_node=2)
    cluster.prepare()
    cluster.start(ready_timeout=90)
    env = user_env(cluster.state_dir, commands_on_path=True)
    payload = tmp_path / "payload.sh"
    payload.write_text(PAYLOAD)
    payload.chmod(0o755)
    try:
        yield cluster, Cli(env=env, workdir=tmp_path)
    finally:
        cluster.stop()


def described(processes: list[tuple[int, str, str]]) -> list[str]:
    """The job's processes with their command lines and parents (what an assertion shows)."""
    out = []
    for pid, node, attempt in processes:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except OSError:
            argv, ppid = "(gone)", "?"
        out.append(f"{pid} (parent {ppid}) on {node} attempt {attempt}: {argv.strip()}")
    return out


def events(cli: Cli) -> list[str]:
    """The payload's lines so far."""
    path = cli.workdir / "events.log"
    return path.read_text().splitlines() if path.exists() else []


def both_up(cli: Cli, attempt: int) -> bool:
    """Both ranks of the attempt started."""
    return {
        line.split()[1] for line in events(cli) if line.startswith("up ") and line.split()[3] == str(attempt)
    } == {
        "node1",
        "node2",
    }


def start_job(cli: Cli) -> int:
    """Submit the 2-node job and wait until both of its ranks run."""
    job = cli.sbatch(SCRIPT)
    out = cli.workdir / "job.out"
    wait_until(
        lambda: both_up(cli, 0),
        what=f"both ranks of attempt 0 up (job.out: {out.read_text() if out.exists() else ''})",
        timeout=40,
    )
    return job


@pytest.mark.parametrize("stop", ["scancel", "requeue"])
def test_every_process_of_the_run_on_every_node_gets_sigterm_and_its_grace(
    own_cluster: tuple[LocalCluster, Cli], stop: str
) -> None:
    _, cli = own_cluster
    job = start_job(cli)
    out = cli("scancel", str(job)) if stop == "scancel" else cli("scontrol", "requeue", str(job))
    assert out.returncode == 0, out.stderr
    # rank 0 on the batch node (node1) too: it is the one that usually writes the checkpoint
    expected = {"TERM node1 0 0", "TERM node2 1 0", "TERM batch-child - 0"}
    wait_until(lambda: expected <= set(events(cli)), what=f"{expected} all in {events(cli)}", timeout=20)
    wait_until(
        lambda: not [p for p in job_processes(job) if p[2] == "0"],
        what="attempt 0's processes gone",
        timeout=40,
    )
    if stop == "scancel":
        assert cli.wait_state(job, ("CANCELLED",)).startswith("CANCELLED")
    else:
        cli("scancel", str(job))


def test_a_peer_whose_agent_died_kills_the_stale_attempt_before_its_gpus_are_used_again(
    own_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = own_cluster
    job = start_job(cli)
    cluster.kill("agent-node2")  # the agent dies; its job processes live on
    cli.wait_state(job, ("PENDING",), timeout=40)  # node2 down after node_timeout: the job is requeued
    assert [p for p in job_processes(job) if p[1] == "node2" and p[2] == "0"], "node2's tasks died too early"
    cluster.revive("agent-node2")
    wait_until(lambda: both_up(cli, 1), what=f"both ranks of attempt 1 up ({events(cli)})", timeout=60)
    lines = events(cli)
    # Node2's attempt-0 rank was told to stop (and stopped) before attempt 1 started on node2's GPUs.
    assert "TERM node2 1 0" in lines, lines
    stale_end = lines.index("TERM node2 1 0")
    new_start = next(
        i for i, line in enumerate(lines) if line.startswith("up node2") and line.endswith(" 1 0,1")
    )
    assert stale_end < new_start, lines
    assert {p[2] for p in job_processes(job)} == {"1"}, described(job_processes(job))
    assert cli("scancel", str(job)).returncode == 0


def test_the_peers_of_a_dead_batch_node_kill_their_tasks_without_it(
    own_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = own_cluster
    job = start_job(cli)
    # Node1 dies with everything on it: its agent and its job processes.
    cluster.kill("agent-node1")
    for pid, node, _ in job_processes(job):
        if node == "node1":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    cli.wait_state(job, ("PENDING",), timeout=40)
    # Node2's rank is stopped although node1's agent is not back: its GPUs do not stay busy with a dead run.
    wait_until(
        lambda: not [p for p in job_processes(job) if p[1] == "node2"],
        what=f"node2's attempt-0 processes gone ({job_processes(job)})",
        timeout=15,
    )
    assert "TERM node2 1 0" in events(cli)
    cluster.revive("agent-node1")
    wait_until(lambda: both_up(cli, 1), what=f"both ranks of attempt 1 up ({events(cli)})", timeout=60)
    assert {p[2] for p in job_processes(job)} == {"1"}, described(job_processes(job))
    assert cli("scancel", str(job)).returncode == 0
