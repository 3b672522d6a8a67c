"""Preemption by QOS (preempt/qos): on a full cluster an ``urgent`` job has a ``scavenger`` job's run killed
(SIGTERM, SIGKILL after the scavenger QOS's grace time) and starts once it is gone; the scavenger job is
requeued (the scheduler's PreemptMode: its QOS sets none) and runs again; sacct shows both jobs' QOS."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2e_cli import Cli, own_cluster, wait_for_line

pytestmark = pytest.mark.e2e

GRACE = 3

#: One node with 2 GPUs, one partition; urgent may preempt scavenger, which has a grace time of its own.
CONFIG = f"""
[cluster]
name = "local"
heartbeat_interval = 1
node_timeout = 6
kill_wait = 1

[scheduler]
preempt_type = "qos"
preempt_mode = "requeue"
priority_weight_qos = 1000     # urgent jobs are considered first (only the first blocked job preempts)

[[nodes]]
names = "node1"
cpus = 8
memory = "8G"
gpus = 2
gpu_type = "sim"

[[partitions]]
name = "gpu"
nodes = "node1"
default = true

[[qos]]
name = "urgent"
priority = 100
preempt = ["scavenger"]

[[qos]]
name = "scavenger"
grace_time = {GRACE}
"""


@pytest.fixture(scope="module")
def qos_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """A one-node cluster with preempt/qos."""
    with own_cluster(tmp_path_factory.mktemp("qospreempt"), CONFIG, nodes=1, gpus_per_node=2) as cli:
        yield cli


#: Notes SIGTERM and keeps running in its first run (so only the SIGKILL after the grace frees the GPUs),
#: and completes in its second.
SCAVENGER = """#!/bin/bash
#SBATCH -J scav --qos=scavenger --gres=gpu:2 -t 10:00 --open-mode=append -o scav.out
trap 'echo "term $SLURM_RESTART_COUNT $(date +%s.%N)"' TERM
echo "start $SLURM_RESTART_COUNT"
if [ "$SLURM_RESTART_COUNT" = 0 ]; then
  while true; do sleep 0.2; done
fi
echo "done $SLURM_RESTART_COUNT"
"""

URGENT = """#!/bin/bash
#SBATCH -J urgent --qos=urgent --gres=gpu:2 -t 1:00 -o urgent.out
echo "urgent $(date +%s.%N)"
"""


def test_an_urgent_job_preempts_a_scavenger_job_which_is_requeued(qos_cluster: Cli) -> None:
    cli = qos_cluster
    scav = cli.sbatch(SCAVENGER)
    cli.wait_state(scav, ("RUNNING",))
    wait_for_line(cli.workdir / "scav.out", "start 0")
    # A job of a QOS that urgent does not list (normal) waits behind it and preempts nothing.
    normal = cli.sbatch("#!/bin/bash\n#SBATCH -J normal --gres=gpu:2 -t 1:00\ntrue\n")
    time.sleep(2)
    assert cli.sacct(scav, "State") == "RUNNING"
    urgent = cli.sbatch(URGENT)
    assert cli.wait_state(urgent, ("COMPLETED",), timeout=40) == "COMPLETED|0:0"
    termed = float(wait_for_line(cli.workdir / "scav.out", "term 0").split()[2])
    started = float(wait_for_line(cli.workdir / "urgent.out", "urgent").split()[1])
    # SIGTERM first; the run ignored it, so only the SIGKILL after the QOS's grace time freed the GPUs.
    assert started - termed >= GRACE - 0.5, (termed, started)
    # Requeued (same id, restart count 1): its second run completes.
    assert cli.wait_state(scav, ("COMPLETED",), timeout=40) == "COMPLETED|0:0"
    out = (cli.workdir / "scav.out").read_text()
    assert "start 1" in out and "done 1" in out and "done 0" not in out, out
    assert "Restarts=1" in cli("scontrol", "show", "job", str(scav)).stdout
    assert cli.wait_state(normal, ("COMPLETED",), timeout=40) == "COMPLETED|0:0"
    # sacct shows each job's QOS as resolved at submit.
    assert [cli.sacct(j, "QOS") for j in (scav, urgent, normal)] == ["scavenger", "urgent", "normal"]
