"""Memory confinement on a real local cluster (``constrain_ram_space``): a run over its ``--mem`` is
OOM-killed by the kernel and ends OUT_OF_MEMORY (ExitCode 0:125, as in Slurm); one within it completes;
nothing it started survives it; and no cgroup of the cluster is left once it stops."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_cluster import agent_cluster, wait_until
from e2e_cli import BIN, Cli

from corral.cli.local_cluster import LocalCluster
from corral.services.agent import memcg

pytestmark = pytest.mark.e2e

ENDED = ("COMPLETED", "FAILED", "OUT_OF_MEMORY", "CANCELLED", "TIMEOUT", "NODE_FAIL")
# Writes every page, so the memory is really charged to the cgroup.
HOG = f"{sys.executable} -c \"b = b'x' * (400 << 20); print('survived', len(b))\""
# The job's own memory cgroup (v1: the memory line; v2: the unified line), and its limit.
SHOW_CGROUP = """
line=$(grep -E '^[0-9]+:(memory|):' /proc/self/cgroup | grep -v '^0::/$' | head -1)
path=${line#*:*:}
echo "cgroup $path"
for f in memory.limit_in_bytes memory.max; do
  for mnt in /sys/fs/cgroup/memory /sys/fs/cgroup; do
    [ -f "$mnt$path/$f" ] && echo "limit $(cat "$mnt$path/$f")"
  done
done
true
"""

if memcg.probe("corral")[0] is None:
    pytest.skip("no writable memory cgroup on this machine", allow_module_level=True)


@pytest.fixture(scope="module")
def oom_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Cli]]:
    """A cluster of our own: the last test stops it and looks for leftovers."""
    with agent_cluster(tmp_path_factory.mktemp("oom")) as pair:
        yield pair


def cluster_cgroups(cluster: LocalCluster) -> list[str]:
    """The run cgroups of the cluster's agents that exist now."""
    confinement, _ = memcg.probe("corral")
    assert confinement is not None
    tags = [memcg.cluster_tag("local", str(cluster.state_dir / "agents" / n)) for n in ("node1", "node2")]
    return [c for tag in tags for c in confinement.children(tag + "_")]


def job_lines(path: Path, key: str) -> list[str]:
    """The values of the output lines that start with ``key``."""
    return [line.split(" ", 1)[1] for line in path.read_text().splitlines() if line.startswith(key + " ")]


def test_a_job_over_its_memory_ends_out_of_memory(oom_cluster: tuple[LocalCluster, Cli]) -> None:
    _, cli = oom_cluster
    out = cli.workdir / "oom.out"
    job = cli.sbatch(f"#!/bin/bash\n{HOG}\necho after $?\n", "--mem=64M", "-o", str(out))
    row = cli.wait_state(job, ENDED, timeout=60)
    assert row == "OUT_OF_MEMORY|0:125", (row, out.read_text())
    # The kernel killed python (SIGKILL, so bash saw 137) before it could say it survived.
    assert job_lines(out, "survived") == [] and job_lines(out, "after") == ["137"], out.read_text()
    steps = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
    assert f"{job}.batch|OUT_OF_MEMORY|0:125" in steps, steps
    shown = cli("scontrol", "show", "job", str(job)).stdout
    assert "JobState=OUT_OF_MEMORY" in shown and "ExitCode=0:125" in shown, shown


def test_a_job_within_its_memory_completes_in_its_own_limited_cgroup(
    oom_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = oom_cluster
    out = cli.workdir / "fits.out"
    script = f"#!/bin/bash\n{SHOW_CGROUP}\n{HOG}\n"
    job = cli.sbatch(script, "--mem=1G", "-o", str(out))
    row = cli.wait_state(job, ENDED, timeout=60)
    assert row == "COMPLETED|0:0", (row, out.read_text())
    tag = memcg.cluster_tag("local", str(cluster.state_dir / "agents" / "node1"))
    (path,) = job_lines(out, "cgroup")
    assert path.endswith(f"/{tag}_node1_{job}.0"), path
    assert job_lines(out, "limit") == [str(1024 * 1024 * 1024)]
    assert job_lines(out, "survived") == [str(400 << 20)]
    assert not os.path.exists(path), "the run's cgroup outlived it"


def test_without_mem_a_run_is_confined_to_its_nodes_memory(oom_cluster: tuple[LocalCluster, Cli]) -> None:
    _, cli = oom_cluster
    out = cli.workdir / "node.out"
    job = cli.sbatch(f"#!/bin/bash\n{SHOW_CGROUP}\n", "-o", str(out))
    assert cli.wait_state(job, ENDED, timeout=60) == "COMPLETED|0:0", out.read_text()
    assert job_lines(out, "limit") == [str(64 * 1024 * 1024 * 1024)]  # the node's configured 64G


def test_a_step_over_the_jobs_memory_makes_the_job_out_of_memory(
    oom_cluster: tuple[LocalCluster, Cli],
) -> None:
    _, cli = oom_cluster
    out = cli.workdir / "step.out"
    job = cli.sbatch(f"#!/bin/bash\n{BIN}/srun {HOG}\necho srun $?\n", "--mem=64M", "-o", str(out))
    row = cli.wait_state(job, ENDED, timeout=60)
    assert row == "OUT_OF_MEMORY|0:125", (row, out.read_text())
    assert job_lines(out, "survived") == [], out.read_text()


def test_a_step_on_a_peer_node_is_confined_and_its_oom_ends_the_job_out_of_memory(
    oom_cluster: tuple[LocalCluster, Cli],
) -> None:
    """node2 runs no batch script: its agent makes the run a cgroup for the step (the job's --mem there),
    the task over it is OOM-killed, the step and the job end OUT_OF_MEMORY, and the cgroup goes."""
    cluster, cli = oom_cluster
    out = cli.workdir / "peer-oom.out"
    task = cli.workdir / "peer-task.sh"
    task.write_text(f"#!/bin/bash\nif [ $SLURM_NODEID = 1 ]; then\n{SHOW_CGROUP}\n{HOG}\nfi\nsleep 1\n")
    job = cli.sbatch(
        f"#!/bin/bash\n{BIN}/srun -N2 -n2 -l bash {task}\necho srun $?\n",
        "-N2",
        "--mem=64M",
        "-o",
        str(out),
    )
    row = cli.wait_state(job, ENDED, timeout=60)
    assert row == "OUT_OF_MEMORY|0:125", (row, out.read_text())
    text = out.read_text()
    assert "1: limit 67108864" in text and "1: survived" not in text, text
    assert "1: cgroup /corral/" in text and "_node2_" in text, text
    steps = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
    assert f"{job}.0|OUT_OF_MEMORY|0:125" in steps, steps
    node2 = memcg.cluster_tag("local", str(cluster.state_dir / "agents" / "node2"))
    wait_until(
        lambda: not [c for c in cluster_cgroups(cluster) if c.rsplit("/", 1)[-1].startswith(node2)],
        timeout=20,
        what="node2's cgroup for the run removed",
    )


def test_what_escaped_the_process_group_ends_with_the_run(oom_cluster: tuple[LocalCluster, Cli]) -> None:
    _, cli = oom_cluster
    out = cli.workdir / "escape.out"
    # setsid: a new session and process group, out of reach of the process-group kill.
    job = cli.sbatch("#!/bin/bash\nsetsid sleep 300 &\necho escaped $!\n", "--mem=100M", "-o", str(out))
    assert cli.wait_state(job, ENDED, timeout=60) == "COMPLETED|0:0"
    (pid,) = job_lines(out, "escaped")
    wait_until(lambda: not Path(f"/proc/{pid}").exists(), timeout=10, what="the escaped sleep killed")


def test_a_run_whose_supervisor_vanished_is_emptied_and_removed_by_its_agent(
    oom_cluster: tuple[LocalCluster, Cli],
) -> None:
    cluster, cli = oom_cluster
    out = cli.workdir / "orphan.out"
    job = cli.sbatch("#!/bin/bash\necho script $$\nsleep 300\n", "--mem=100M", "--no-requeue", "-o", str(out))
    pids = cluster.state_dir / "agents" / "node1" / "jobs" / f"{job}.0" / "pids"
    wait_until(lambda: pids.exists() and out.exists() and "script" in out.read_text(), what="job running")
    recorded = json.loads(pids.read_text())  # the batch step's supervisor and its task 0, the script
    supervisor, script = recorded["stepd"][0], recorded["tasks"]["0"][0]
    os.kill(supervisor, signal.SIGKILL)
    assert cli.wait_state(job, ENDED, timeout=60).startswith("NODE_FAIL")
    wait_until(lambda: not Path(f"/proc/{script}").exists(), timeout=10, what="the script killed")
    assert cluster_cgroups(cluster) == []


def test_stopping_the_cluster_leaves_no_cgroup(oom_cluster: tuple[LocalCluster, Cli]) -> None:
    cluster, cli = oom_cluster
    out = cli.workdir / "running.out"
    job = cli.sbatch(f"#!/bin/bash\n{SHOW_CGROUP}\nsleep 300\n", "--mem=100M", "-o", str(out))
    wait_until(lambda: out.exists() and "limit" in out.read_text(), timeout=60, what=f"job {job} running")
    assert len(cluster_cgroups(cluster)) == 1
    started = time.monotonic()
    cluster.stop()
    assert cluster_cgroups(cluster) == [], f"left after stop ({time.monotonic() - started:.1f}s)"
