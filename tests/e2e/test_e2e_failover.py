"""Scheduler failover on a real local cluster with two scheduler processes.

1. The leader is killed with SIGKILL: the standby makes the next decision (a job submitted after the kill is
   allocated) within the failover target, with a higher epoch; ``scontrol ping`` shows the change.
2. The new leader is paused (SIGSTOP) past its lease: the other takes over and runs the jobs submitted
   meanwhile; the paused one resumes (SIGCONT), notices it lost the lease, becomes a standby, and appends no
   decision of its old epoch: every job is allocated once and completes once, no GPU is given twice.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import signal
import socket
import time
from collections.abc import Iterator

import pytest
from e2e_cli import Cli, user_env

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.core.fold import apply
from corral.libs.core.lease import DEFAULT_TTL_S
from corral.libs.core.state import State
from corral.libs.infra import roles
from corral.libs.runtime.bus import Bus, LogEntry
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import events as ev
from corral.schemas import lifecycle

pytestmark = pytest.mark.e2e

SHORT = "#!/bin/bash\nsleep 1\n"
#: The failover target: from the leader's death to the next decision.
TARGET_S = 5.0
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Cli]]:
    """A local cluster with a second scheduler, ``standby``."""
    root = tmp_path_factory.mktemp("ha")
    cluster = LocalCluster(root / "state", getpass.getuser(), nodes=2, gpus_per_node=2)
    cluster.state_dir.mkdir(mode=0o700)
    config = cluster.prepare()
    assert ensure_resolvable([n.name for n in config.nodes]) is None
    cluster.start(ready_timeout=90)
    try:
        cluster.spawn_scheduler("standby")
        yield cluster, Cli(env=user_env(cluster.state_dir), workdir=root)
    finally:
        cluster.stop()


def log_entries(cluster: LocalCluster) -> list[LogEntry]:
    """The whole log, read as the admin."""

    async def read() -> list[LogEntry]:
        nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="test-failover")
        try:
            return [entry async for entry in Bus(nc, "test").read(1)]
        finally:
            await nc.drain()

    return asyncio.run(read())


def allocation(cluster: LocalCluster, job_id: int) -> LogEntry | None:
    for entry in log_entries(cluster):
        body = entry.envelope.body if entry.envelope is not None else None
        if isinstance(body, ev.JobAllocated) and body.job_id == job_id:
            return entry
    return None


def wait(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not in {timeout}s")


def ping(cli: Cli) -> list[str]:
    lines: list[str] = cli("scontrol", "ping").stdout.splitlines()
    return lines


def epoch_of(entry: LogEntry | None) -> int:
    assert entry is not None and entry.envelope is not None
    epoch: int = entry.envelope.body.epoch  # type: ignore[union-attr]
    return epoch


def test_a_killed_leader_is_replaced_within_the_target(ha: tuple[LocalCluster, Cli]) -> None:
    cluster, cli = ha
    both = [f"Slurmctld(primary) at {HOST} is UP", "Slurmctld(backup) at standby is UP"]
    wait(lambda: ping(cli) == both, 30, f"scontrol ping shows {both} (last: {ping(cli)})")
    first = cli.sbatch(SHORT)
    cli.wait_state(first, ("COMPLETED",))
    cluster.kill("scheduler")
    killed = time.time()
    job = cli.sbatch(SHORT)
    wait(lambda: allocation(cluster, job) is not None, 30, f"job {job} allocated after the kill")
    decided = allocation(cluster, job)
    assert decided is not None and decided.envelope is not None
    failover = decided.envelope.meta.occurred_at - killed
    assert failover < TARGET_S, f"the standby decided {failover:.2f}s after the kill"
    assert epoch_of(decided) > epoch_of(allocation(cluster, first))
    assert cli.wait_state(job, ("COMPLETED",)).startswith("COMPLETED")
    # The dead one's presence goes silent: it shows DOWN once a TTL passed without a beat.
    after = ["Slurmctld(primary) at standby is UP", f"Slurmctld(backup) at {HOST} is DOWN"]
    wait(lambda: ping(cli) == after, 4 * DEFAULT_TTL_S, f"scontrol ping shows {after} (last: {ping(cli)})")


def test_a_paused_leader_changes_nothing_when_it_resumes(ha: tuple[LocalCluster, Cli]) -> None:
    cluster, cli = ha
    cluster.revive("scheduler")  # killed by the test above: a standby now
    both = ["Slurmctld(primary) at standby is UP", f"Slurmctld(backup) at {HOST} is UP"]
    wait(lambda: ping(cli) == both, 30, f"scontrol ping shows {both} (last: {ping(cli)})")
    paused = cluster.process("scheduler-standby").proc
    assert paused is not None
    before = len(log_entries(cluster))
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        # Every scheduler answers every query and the first answer wins: the paused leader delays none,
        # even before its lease lapses (with a queue group, NATS handed requests to it to time out).
        for command in (["squeue"], ["scontrol", "ping"], ["sinfo"], ["squeue", "--start"]):
            asked = time.monotonic()
            assert cli(*command).returncode == 0
            assert time.monotonic() - asked < 5.0, f"{command} waited for the paused scheduler"
        jobs = [cli.sbatch(SHORT, "--gres=gpu:2") for _ in range(3)]
        # The other takes over and allocates.
        wait(lambda: allocation(cluster, jobs[0]) is not None, 30, f"job {jobs[0]} allocated while paused")
        time.sleep(1.0)  # the paused one's lease long lapsed: decisions of its epoch would be fenced now
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    resumed = time.time()
    for job in jobs:
        assert cli.wait_state(job, ("COMPLETED",), timeout=90).startswith("COMPLETED")
    log_text = (cluster.state_dir / "logs" / "scheduler-standby.log").read_text()
    assert "lost the scheduler lease: standby" in log_text
    wait(lambda: ping(cli)[1:] == ["Slurmctld(backup) at standby is UP"], 30, "the resumed one is a standby")

    entries = log_entries(cluster)
    old = max(epoch_of(e) for e in entries[:before] if _decision(e))
    new = [e for e in entries[before:] if _decision(e)]
    assert new and min(epoch_of(e) for e in new) > old
    # Nothing of the old epoch after the takeover, nor anything the fold fences, nor a GPU given twice.
    state = State()
    allocated: dict[int, int] = {}
    for entry in entries:
        assert entry.envelope is not None
        outcome = apply(state, entry.seq, entry.envelope)
        assert outcome.reason != "stale_epoch"
        body = entry.envelope.body
        if isinstance(body, ev.JobAllocated):
            assert outcome.applied, (body, outcome)
            allocated[body.job_id] = allocated.get(body.job_id, 0) + 1
        if entry.envelope.meta.occurred_at > resumed and _decision(entry):
            assert epoch_of(entry) > old
    assert all(allocated[job] == 1 for job in jobs)
    assert all(state.jobs[job].state == "COMPLETED" and state.jobs[job].restart_count == 0 for job in jobs)


def _decision(entry: LogEntry) -> bool:
    return entry.envelope is not None and type(entry.envelope.body) in lifecycle.DECISIONS
