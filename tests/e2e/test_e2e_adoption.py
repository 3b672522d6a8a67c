"""The restart and adoption rules of the agent, as a table: the agent dies (as SIGKILL would) at each point of
a batch script's launch, the run's supervisor lives on, dies, or ends while the agent is down, and the next
agent process must take up the run exactly once.

For every row, whatever happened:
- the job is not lost: it reaches its end (the script's exit code 3, ``FAILED 3:0``), rerun if need be;
- no attempt's script runs twice, and the job's last run is the one that ended it;
- nothing of the job is left running afterwards.

A row also names what the job's history must show: ``once`` (attempt 0 ran and its end is the job's end)
or ``rerun`` (attempt 0 was lost with its supervisor, or never started, and attempt 1 ended the job).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_cluster import wait_until
from e2e_cli import Cli, job_processes, user_env

from corral.cli.local_cluster import LocalCluster
from corral.services.agent.crashpoints import CRASH_EXIT

pytestmark = pytest.mark.e2e

SCRIPT = """#!/bin/bash
#SBATCH -o job.%j.out
echo "start $SLURM_JOB_ID $SLURM_RESTART_COUNT" >> starts.log
while [ ! -e go.$SLURM_JOB_ID ]; do sleep 0.1; done
exit 3
"""

# (crash point, what happens to the supervisor while the agent is down, expected history)
ROWS = [
    ("launch.recorded", "none", "rerun"),
    ("launch.supervisor_started", "alive", "once"),
    ("launch.supervisor_started", "dies", "rerun"),
    ("launch.supervisor_started", "ends", "once"),
    ("launch.handshake_recorded", "alive", "once"),
    ("launch.handshake_recorded", "dies", "rerun"),
    ("launch.handshake_recorded", "ends", "once"),
    ("launch.started_reported", "alive", "once"),
    ("launch.started_reported", "dies", "rerun"),
    ("launch.started_reported", "ends", "once"),
]


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Cli]]:
    """A 1-node cluster of its own: the rows stop and start its agent."""
    root = tmp_path_factory.mktemp("adoption")
    cluster = LocalCluster(root / "state", getpass.getuser(), nodes=1, gpus_per_node=2)
    cluster.prepare()
    cluster.start(ready_timeout=90)
    env = user_env(cluster.state_dir, commands_on_path=True)
    try:
        yield cluster, Cli(env=env, workdir=root)
    finally:
        cluster.stop()


def job_pids(job: int) -> list[int]:
    """Live processes of the job: its supervisors and its script carry its environment."""
    return [pid for pid, _, _ in job_processes(job)]


def starts(cli: Cli, job: int) -> list[str]:
    """The attempts of the job whose script started, in order."""
    log = cli.workdir / "starts.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [line.split()[2] for line in lines if line.split()[1] == str(job)]


def restart_agent(cluster: LocalCluster, crash_at: str | None) -> None:
    """Stop the agent cleanly (its jobs live on) and start it again, armed to die at ``crash_at``."""
    agent = cluster.process("agent-node1")
    cluster.terminate("agent-node1")
    agent.argv = [a for a in agent.argv if not a.startswith("--crash-at=")]
    if crash_at is not None:
        agent.argv.append(f"--crash-at={crash_at}")
    cluster.revive("agent-node1")


def submit_to_a_dying_agent(cluster: LocalCluster, cli: Cli, point: str, script: str) -> int:
    """Arm the agent to die at ``point``, submit ``script``, and wait until the agent died there."""
    restart_agent(cluster, point)
    job = cli.sbatch(script)
    agent = cluster.process("agent-node1")
    wait_until(lambda: agent.proc is not None and agent.proc.poll() is not None, 30, "the agent to die")
    assert agent.proc is not None and agent.proc.returncode == CRASH_EXIT
    return job


@pytest.mark.parametrize(("point", "supervisor", "history"), ROWS, ids=[f"{p}-{s}" for p, s, _ in ROWS])
def test_the_agent_takes_up_a_run_exactly_once_whatever_point_it_died_at(
    one_node: tuple[LocalCluster, Cli], point: str, supervisor: str, history: str
) -> None:
    cluster, cli = one_node
    job = submit_to_a_dying_agent(cluster, cli, point, SCRIPT)
    time.sleep(0.5)  # a supervisor started just before the crash has its script running by now
    if supervisor == "dies":
        for pid in job_pids(job):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not job_pids(job), 10, "the job's processes to die")
    elif supervisor == "ends":
        (cli.workdir / f"go.{job}").touch()
        wait_until(lambda: not job_pids(job), 10, "the run to end while its agent is down")
    restart_agent(cluster, None)
    (cli.workdir / f"go.{job}").touch()
    row = cli.wait_state(job, ("FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL"), timeout=60)
    assert row == "FAILED|3:0", row
    ran = starts(cli, job)
    assert len(ran) == len(set(ran)), f"an attempt's script ran twice: {ran}"
    if history == "once":
        assert ran == ["0"], ran
    else:
        assert ran[-1:] == ["1"] and set(ran) <= {"0", "1"}, ran
    wait_until(lambda: not job_pids(job), 10, f"nothing of job {job} left running ({job_pids(job)})")


STEP_SCRIPT = """#!/bin/bash
#SBATCH -o job.%j.out
srun -n 1 bash -c 'echo "task $SLURM_JOB_ID $SLURM_RESTART_COUNT" >> tasks.log
                   while [ ! -e go.$SLURM_JOB_ID ]; do sleep 0.1; done'
echo "srun exited $?"
while [ ! -e go.$SLURM_JOB_ID ]; do sleep 0.1; done
exit 3
"""

STEP_ROWS = [
    ("step.supervisor_started", "alive"),
    ("step.supervisor_started", "dies"),
    ("step.started", "alive"),
    ("step.started", "dies"),
]


def step_pids(job: int) -> list[int]:
    """Live processes of the job's step tasks (they carry SLURM_STEP_ID)."""
    pids = []
    for pid in job_pids(job):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue  # it ended since it was listed
        if b"\0SLURM_STEP_ID=" in b"\0" + environ:
            pids.append(pid)
    return pids


@pytest.mark.parametrize(("point", "supervisor"), STEP_ROWS, ids=[f"{p}-{s}" for p, s in STEP_ROWS])
def test_a_step_launch_cut_by_the_agent_dying_runs_its_tasks_once_and_is_accounted(
    one_node: tuple[LocalCluster, Cli], point: str, supervisor: str
) -> None:
    cluster, cli = one_node
    job = submit_to_a_dying_agent(cluster, cli, point, STEP_SCRIPT)
    time.sleep(0.5)
    if supervisor == "dies":
        for pid in step_pids(job):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    restart_agent(cluster, None)
    (cli.workdir / f"go.{job}").touch()
    row = cli.wait_state(job, ("FAILED", "COMPLETED", "CANCELLED", "NODE_FAIL"), timeout=60)
    assert row == "FAILED|3:0", row  # the batch script's end, its one run
    tasks = [
        line for line in (cli.workdir / "tasks.log").read_text().splitlines() if f" {job} " in f"{line} "
    ]
    assert tasks == [f"task {job} 0"], tasks  # the task ran, once
    if supervisor == "alive":
        # srun asked again with the same key: the restarted agent answered with the step it had started,
        # and srun saw it end as it did.
        out = (cli.workdir / f"job.{job}.out").read_text()
        assert "srun exited 0" in out.splitlines(), out
    # The step is accounted as ended, not left RUNNING.
    wait_until(
        lambda: (
            (out := cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State").stdout)
            and f"{job}.0|" in out
            and f"{job}.0|RUNNING" not in out
        ),
        30,
        f"step {job}.0 accounted as ended",
    )
    wait_until(lambda: not job_pids(job), 10, f"nothing of job {job} left running ({job_pids(job)})")
