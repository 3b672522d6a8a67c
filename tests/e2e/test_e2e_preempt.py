"""Preemption by partition tier: a high-tier job has a low-tier job's run killed (SIGTERM, SIGKILL after the
grace time) and starts once it is gone; the low-tier job is requeued (or ends PREEMPTED in cancel mode)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2e_cli import Cli, own_cluster, wait_for_line

pytestmark = pytest.mark.e2e

GRACE = 3

#: One node with 2 GPUs in three partitions: scavenger (tier 0, cancel mode), low (tier 1), high (tier 2).
CONFIG = f"""
[cluster]
name = "local"
heartbeat_interval = 1
node_timeout = 6
kill_wait = 1
# Slurm's default (Corral's is ALL): a job over its partition's limits is accepted and pends.
enforce_part_limits = "NO"

[scheduler]
preempt_type = "partition_prio"
preempt_mode = "requeue"

[[nodes]]
names = "node1"
cpus = 8
memory = "8G"
gpus = 2
gpu_type = "sim"

[[partitions]]
name = "low"
nodes = "node1"
default = true
grace_time = {GRACE}

[[partitions]]
name = "scavenger"
nodes = "node1"
priority_tier = 0
preempt_mode = "cancel"

[[partitions]]
name = "high"
nodes = "node1"
priority_tier = 2
"""


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """A one-node cluster whose partitions of three tiers share the node, with partition_prio preemption."""
    with own_cluster(tmp_path_factory.mktemp("preempt"), CONFIG, nodes=1, gpus_per_node=2) as cli:
        yield cli


#: The low-tier job: notes SIGTERM and keeps running in its first run (so it must be SIGKILLed after the
#: grace), and completes in its second.
LOW = """#!/bin/bash
#SBATCH -J low -p low --gres=gpu:2 -t 10:00 --open-mode=append -o low.out
trap 'echo "term $SLURM_RESTART_COUNT $(date +%s.%N)"' TERM
echo "start $SLURM_RESTART_COUNT"
if [ "$SLURM_RESTART_COUNT" = 0 ]; then
  while true; do sleep 0.2; done
fi
echo "done $SLURM_RESTART_COUNT"
"""

HIGH = """#!/bin/bash
#SBATCH -J high -p high --gres=gpu:2 -t 1:00 -o high.out
echo "high $(date +%s.%N)"
"""


def test_a_high_tier_job_preempts_a_low_tier_job_which_gets_the_grace_then_is_requeued(tiered: Cli) -> None:
    cli = tiered
    low = cli.sbatch(LOW)
    cli.wait_state(low, ("RUNNING",))
    wait_for_line(cli.workdir / "low.out", "start 0")
    high = cli.sbatch(HIGH)
    assert cli.wait_state(high, ("COMPLETED",), timeout=40) == "COMPLETED|0:0"
    termed = float(wait_for_line(cli.workdir / "low.out", "term 0").split()[2])
    started = float(wait_for_line(cli.workdir / "high.out", "high").split()[1])
    # SIGTERM first; the run ignored it, so only the SIGKILL after the grace time freed the GPUs.
    assert started - termed >= GRACE - 0.5, (termed, started)
    # The low job was requeued (same id, restart count 1) and its second run completes.
    assert cli.wait_state(low, ("COMPLETED",), timeout=40) == "COMPLETED|0:0"
    out = (cli.workdir / "low.out").read_text()
    assert "start 1" in out and "done 1" in out and "done 0" not in out, out
    shown = cli("scontrol", "show", "job", str(low)).stdout
    assert "Restarts=1" in shown, shown


def test_a_preempted_job_of_a_cancel_mode_partition_ends_preempted(tiered: Cli) -> None:
    cli = tiered
    scav = cli.sbatch("#!/bin/bash\n#SBATCH -J scav -p scavenger --gres=gpu:2 -t 10:00\nsleep 600\n")
    cli.wait_state(scav, ("RUNNING",))
    high = cli.sbatch(HIGH)
    assert cli.wait_state(scav, ("PREEMPTED",), timeout=30).startswith("PREEMPTED|")
    assert cli.wait_state(high, ("COMPLETED",), timeout=30) == "COMPLETED|0:0"
    assert cli.sacct(scav, "State,Reason") == "PREEMPTED|Preempted"
    assert cli("squeue", "-h", "-j", str(scav), "-o", "%T").stdout.strip() == "PREEMPTED"


def test_with_enforce_part_limits_no_a_job_too_big_for_its_partition_pends_as_in_slurm(tiered: Cli) -> None:
    # (This module's cluster has the setting; the job does not touch the preemption tests' node.)
    job = tiered.sbatch("#!/bin/bash\nhostname\n", "-N", "99", "-p", "high", "-o", "/dev/null")
    shown = ["squeue", "-h", "-j", str(job), "-o", "%T %R"]
    deadline = time.monotonic() + 10  # (the reason is the scheduler's next cycle's)
    while (out := tiered(*shown)).stdout.split() != ["PENDING", "(PartitionConfig)"]:
        assert time.monotonic() < deadline, out.stdout + out.stderr
        time.sleep(0.2)
    assert tiered("scancel", str(job)).returncode == 0
