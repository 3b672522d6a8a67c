"""The job environment in Slurm 22.05's forms (issue 15, item 4), end to end: a real user's batch job and
its srun step on 2 nodes of a cluster started by root, each dumping ``env``; the variables Slurm sets and
Corral did not, the ones Corral set and Slurm does not gone, and each run's private TMPDIR made on each
node for the job's owner (0700) and removed once the run ended there."""

from __future__ import annotations

import getpass
import ipaddress
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from unix_users import UnixUser, UserCli, open_directory, unix_users, user_cli, user_commands

from corral.cli.local_cluster import LocalCluster, ensure_resolvable

pytestmark = pytest.mark.e2e

USER, GROUP = "ctest-envuser", "ctest-envteam"

#: Submitted without -n: Slurm's batch shell then has no SLURM_NTASKS, SLURM_NPROCS, SLURM_NTASKS_PER_NODE.
JOB = """#!/bin/bash
#SBATCH -N2
#SBATCH --gres=gpu:2
#SBATCH -o out-%j.txt
env > batch-$SLURM_JOB_ID.env
echo "pid=$$" >> batch-$SLURM_JOB_ID.env
echo "umask=$(umask)" >> batch-$SLURM_JOB_ID.env
stat -c 'tmpdir=%u %a' "$TMPDIR" >> batch-$SLURM_JOB_ID.env
srun bash -c 'f=step-$SLURM_JOB_ID-$SLURM_PROCID.env; env > $f; echo "pid=$$" >> $f; \
stat -c "tmpdir=%u %a" "$TMPDIR" >> $f; touch "$TMPDIR/left-behind"'
"""
#: A job without GPUs, with -n: SLURM_NTASKS in its batch shell, no GPU variable in its step.
CPU_JOB = """#!/bin/bash
#SBATCH -n1
#SBATCH -o out-%j.txt
echo "ntasks=$SLURM_NTASKS"
srun bash -c 'env > step-cpu-$SLURM_JOB_ID.env'
"""
#: one switch per node (topology/tree's SLURM_TOPOLOGY_ADDR: ``leaf1.node1``)
BLOCKS = '\n[[blocks]]\nname = "leaf1"\nnodes = "node1"\n\n[[blocks]]\nname = "leaf2"\nnodes = "node2"\n'
GPU_ORDINALS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


@pytest.fixture(scope="module")
def user() -> Iterator[UnixUser]:
    """A real user (ctest-envuser), removed afterwards."""
    with unix_users((USER,), GROUP) as made:
        yield made[0]


@pytest.fixture(scope="module")
def base() -> Iterator[Path]:
    """Where the agents make the runs' TMPDIRs (``[cluster] tmpdir_base``)."""
    with open_directory("corral-tmpbase-") as folder:
        yield folder


@pytest.fixture(scope="module")
def cluster(user: UnixUser, base: Path) -> Iterator[LocalCluster]:
    """2 nodes in two switches ([[blocks]]), started by root, with the user as its guest."""
    with open_directory("corral-jobenv-") as state:
        cluster = LocalCluster(state, getpass.getuser(), guests=(USER,), nodes=2, gpus_per_node=2)
        try:
            cluster.prepare()
            text = cluster.config_path.read_text().replace(
                "[cluster]\n", f'[cluster]\ntmpdir_base = "{base}"\n', 1
            )
            cluster.config_path.write_text(text + BLOCKS)
            config = cluster.prepare()
            assert config.tmpdir_base == str(base) and ensure_resolvable(["node1", "node2"]) is None
            cluster.start(ready_timeout=90)
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="module")
def cli(cluster: LocalCluster, user: UnixUser) -> Iterator[UserCli]:
    """The user's commands, from their home directory."""
    with user_commands(user) as commands:
        yield user_cli(cluster, user, commands)


def variables(path: Path) -> dict[str, str]:
    """``NAME=value`` lines of a dump (``env`` and the lines the job added)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def run_tmpdirs(base: Path) -> list[Path]:
    """The run TMPDIRs the agents have under ``base`` now."""
    return sorted(base.glob("corral-*/*"))


def test_batch_job_and_step_environment_and_tmpdir(
    cli: UserCli, user: UnixUser, cluster: LocalCluster, base: Path
) -> None:
    job = cli.sbatch(JOB)
    row = cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=90)
    assert row == "COMPLETED|0:0", (user.home / f"out-{job}.txt").read_text()
    batch = variables(user.home / f"batch-{job}.env")
    steps = [variables(user.home / f"step-{job}-{task}.env") for task in (0, 1)]
    # Slurm's batch shell
    assert (batch["HOSTNAME"], batch["SLURMD_NODENAME"], batch["ENVIRONMENT"]) == ("node1", "node1", "BATCH")
    assert batch["SLURM_TASK_PID"] == batch["pid"] and batch["SLURM_GTIDS"] == "0"
    assert batch["SLURM_JOB_GID"] == str(user.gid)
    assert batch["SLURM_CONF"] == str(cluster.config_path)
    assert (batch["SLURM_TOPOLOGY_ADDR"], batch["SLURM_TOPOLOGY_ADDR_PATTERN"]) == (
        "leaf1.node1",
        "switch.node",
    )
    assert len(batch["CUDA_VISIBLE_DEVICES"].split(",")) == 2 and batch["SLURM_GPUS_ON_NODE"] == "2"
    assert {batch[name] for name in (*GPU_ORDINALS, "SLURM_JOB_GPUS")} == {batch["CUDA_VISIBLE_DEVICES"]}
    assert not {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE"} & set(batch)  # no -n
    # the run's TMPDIR on the batch node: the owner's alone
    tmpdirs = [Path(batch["TMPDIR"]), *(Path(s["TMPDIR"]) for s in steps)]
    assert tmpdirs[0] == tmpdirs[1] and tmpdirs[0].parent.parent == base and tmpdirs[2] != tmpdirs[0]
    assert batch["tmpdir"] == f"{user.uid} 700"
    # the step's tasks, task 1 on node2
    for task, step in enumerate(steps):
        node = f"node{task + 1}"
        assert step["SLURMD_NODENAME"] == node and step["SLURM_GTIDS"] == str(task)
        assert step["SLURM_TASK_PID"] == step["pid"]
        assert (step["SLURM_TOPOLOGY_ADDR"], step["SLURM_TOPOLOGY_ADDR_PATTERN"]) == (
            f"leaf{task + 1}.{node}",
            "switch.node",
        )
        # srun's environment: the batch shell's HOSTNAME and ENVIRONMENT=BATCH on every node, srun's umask
        assert (step["HOSTNAME"], step["ENVIRONMENT"]) == ("node1", "BATCH")
        assert step["SLURM_UMASK"] == batch["umask"] and step["SLURM_DISTRIBUTION"] == "cyclic"
        srun_host = step["SLURM_LAUNCH_NODE_IPADDR"]  # where the cluster sees srun: this machine
        assert step["SLURM_SRUN_COMM_HOST"] == srun_host and ipaddress.ip_address(srun_host).is_loopback
        assert step["SLURM_SRUN_COMM_PORT"].isdigit() and int(step["SLURM_SRUN_COMM_PORT"]) > 0
        assert {step[name] for name in (*GPU_ORDINALS, "SLURM_STEP_GPUS")} == {step["CUDA_VISIBLE_DEVICES"]}
        assert step["SLURM_GPUS_ON_NODE"] == "2" and step["SLURM_CONF"] == str(cluster.config_path)
        assert step["tmpdir"] == f"{user.uid} 700"
        assert not {"SLURM_NTASKS_PER_NODE"} & set(step) and step["SLURM_NTASKS"] == "2"
    # once the run ended on each node (the peer's by its kill order), its TMPDIR is gone, with the file
    deadline = time.monotonic() + 30
    while any(p.exists() for p in tmpdirs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in tmpdirs if p.exists()]
    agent_dirs = sorted(base.glob("corral-*"))
    assert len(agent_dirs) == 2 and all(stat.S_IMODE(d.stat().st_mode) == 0o711 for d in agent_dirs)
    assert all(os.stat(d).st_uid == 0 for d in agent_dirs)


def test_a_job_with_n_and_no_gpus(cli: UserCli, user: UnixUser) -> None:
    job = cli.sbatch(CPU_JOB)
    assert cli.wait_state(job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED|0:0"
    assert "ntasks=1" in (user.home / f"out-{job}.txt").read_text()
    step = variables(user.home / f"step-cpu-{job}.env")
    assert not {"SLURM_GPUS_ON_NODE", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", *GPU_ORDINALS} & set(step)
    assert step["ENVIRONMENT"] == "BATCH" and step["SLURM_NTASKS"] == "1"
