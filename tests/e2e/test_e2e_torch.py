"""Distributed training over ``sbatch`` + ``srun`` on a local cluster of real processes: PyTorch's ``gloo``
all-reduce and PyTorch Lightning's ``SLURMEnvironment``/``Fabric`` (both released from PyPI, unmodified,
the CPU build of torch) over 2 nodes x 2 tasks, with the environment derived as users' scripts derive it.

The 2 nodes are 2 agents on this machine whose names resolve to 127.0.0.1, so gloo talks over loopback
(``GLOO_SOCKET_IFNAME=lo``, a user-script choice). One thread per rank: 4 ranks share 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
from e2e_cli import Cli

# Only the jobs import torch and lightning (seconds each): the test process just checks they are there.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        find_spec("torch") is None or find_spec("lightning") is None, reason="needs the dev extra's torch"
    ),
]

#: The batch script: one line per rank in its output, through srun's step I/O.
JOB_SCRIPT = """#!/bin/bash
#SBATCH -N2
#SBATCH --ntasks-per-node=2
#SBATCH -o out-%j.txt
export GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1
srun python train.py
"""

#: A training script as users write it for Slurm: rendezvous at the first host of the job's nodes, on a
#: port made of the job id, ranks and sizes from srun's task variables.
ALLREDUCE = """
import datetime, json, os, subprocess
import torch
import torch.distributed as dist

nodelist = os.environ["SLURM_JOB_NODELIST"]
hosts = subprocess.check_output(["scontrol", "show", "hostnames", nodelist], text=True)
os.environ["MASTER_ADDR"] = hosts.split()[0]
os.environ["MASTER_PORT"] = str(20000 + int(os.environ["SLURM_JOB_ID"]) % 10000)
os.environ["RANK"] = os.environ["SLURM_PROCID"]
os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
value = torch.arange(4, dtype=torch.float64) * (rank + 1)
dist.all_reduce(value, op=dist.ReduceOp.SUM)
print("RANK " + json.dumps({
    "rank": dist.get_rank(), "world": dist.get_world_size(), "local_rank": int(os.environ["LOCAL_RANK"]),
    "node": os.environ["SLURMD_NODENAME"], "master": os.environ["MASTER_ADDR"],
    "torch": torch.__version__, "sum": value.tolist(),
}), flush=True)
dist.destroy_process_group()
"""

#: Lightning's own view of the task (SLURMEnvironment), then a real all-reduce through Fabric's DDP.
FABRIC = """
import json, os
import torch
from lightning.fabric import Fabric
from lightning.fabric.plugins.environments import SLURMEnvironment

detected = SLURMEnvironment.detect()
env = SLURMEnvironment()
view = {
    "detected": detected, "global_rank": env.global_rank(), "local_rank": env.local_rank(),
    "node_rank": env.node_rank(), "world_size": env.world_size(),
    "main_address": env.main_address, "main_port": env.main_port,
}
fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2)
fabric.launch()
total = fabric.all_reduce(torch.tensor([fabric.global_rank + 1.0]), reduce_op="sum")
view.update({
    "fabric_env": type(fabric._connector.cluster_environment).__name__,
    "fabric_rank": fabric.global_rank, "fabric_world": fabric.world_size, "fabric_node": fabric.node_rank,
    "node": os.environ["SLURMD_NODENAME"], "sum": total.item(),
})
print("RANK " + json.dumps(view), flush=True)
# Ended as a training script should: without it a rank's gloo threads were still joinable at the
# interpreter's exit once in CI ("terminate called without an active exception", SIGABRT, FAILED|134:0).
torch.distributed.destroy_process_group()
"""

EXPECTED_NODES = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}


def run_training(cli: Cli, workdir: Path, script: str) -> tuple[int, list[dict[str, Any]], str]:
    """Submit ``srun python train.py`` on 2 nodes x 2 tasks with the user's ``sbatch``, from the test's
    shell; wait for the job's end; (job id, one record per rank line in output order, the whole output)."""
    (workdir / "train.py").write_text(script)
    (workdir / "job.sh").write_text(JOB_SCRIPT)
    submitted = subprocess.run(
        ["sbatch", "--parsable", "job.sh"], capture_output=True, text=True, timeout=60, check=False
    )
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout.strip())
    row = cli.wait_state(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=240)
    out = (workdir / f"out-{job}.txt").read_text()
    assert row == "COMPLETED|0:0", out
    lines = [line.removeprefix("RANK ") for line in out.splitlines() if line.startswith("RANK ")]
    records = [json.loads(line) for line in lines]
    return job, records, out


def wait_steps(cli: Cli, job: int, expected: list[str]) -> str:
    """sacct's step rows of ``job`` once every expected row shows (accounting follows the log)."""
    rows = ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode,NTasks").stdout
        if all(r in rows.splitlines() for r in expected):
            break
        time.sleep(0.3)
    return rows


def test_torch_gloo_all_reduce_over_two_nodes(slurm_env: Path, cli: Cli) -> None:
    job, records, out = run_training(cli, slurm_env, ALLREDUCE)
    by_rank = {int(r["rank"]): r for r in records}
    assert len(records) == 4 and sorted(by_rank) == [0, 1, 2, 3], out
    for rank, record in by_rank.items():
        assert record["node"] == EXPECTED_NODES[rank], out
        assert record["local_rank"] == rank % 2 and record["world"] == 4, out
        assert record["master"] == "node1", out
        assert record["torch"] == "2.13.0+cpu", out
        # sum over ranks r of arange(4) * (r + 1): arange(4) * 10
        assert record["sum"] == [0.0, 10.0, 20.0, 30.0], out
    expected = [f"{job}.batch|COMPLETED|0:0|1", f"{job}.0|COMPLETED|0:0|4"]
    rows = wait_steps(cli, job, expected)
    assert all(r in rows.splitlines() for r in expected), rows


def test_lightning_slurm_environment_and_fabric_all_reduce(slurm_env: Path, cli: Cli) -> None:
    job, records, out = run_training(cli, slurm_env, FABRIC)
    by_rank = {int(r["global_rank"]): r for r in records}
    assert len(records) == 4 and sorted(by_rank) == [0, 1, 2, 3], out
    port = 15000 + int(str(job)[-4:])  # Lightning's port: the job id's last 4 digits, from 15000
    for rank, record in by_rank.items():
        assert record["detected"] is True, out
        assert record["node"] == EXPECTED_NODES[rank], out
        assert (record["local_rank"], record["node_rank"], record["world_size"]) == (rank % 2, rank // 2, 4)
        assert (record["main_address"], record["main_port"]) == ("node1", port), out
        assert record["fabric_env"] == "SLURMEnvironment", out
        assert (record["fabric_rank"], record["fabric_world"], record["fabric_node"]) == (rank, 4, rank // 2)
        assert record["sum"] == 10.0, out  # 1 + 2 + 3 + 4
    expected = [f"{job}.batch|COMPLETED|0:0|1", f"{job}.0|COMPLETED|0:0|4"]
    rows = wait_steps(cli, job, expected)
    assert all(r in rows.splitlines() for r in expected), rows
