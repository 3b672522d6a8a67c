"""End to end: real commands, real services, real processes for jobs, on 2 nodes x 4 GPUs."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from e2e_cli import Cli

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e


def env_of(output: Path) -> dict[str, str]:
    """KEY=VALUE lines a job printed."""
    return dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)


def test_two_node_gpu_job_completes_with_the_slurm_environment(cli: Cli) -> None:
    script = (
        "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:2\n#SBATCH -J twonode\n#SBATCH -o out-%j.txt\n"
        "env | grep -E '^(SLURM_|CUDA_VISIBLE_DEVICES)' | sort\n"
    )
    job = cli.sbatch(script)
    assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    env = env_of(cli.workdir / f"out-{job}.txt")
    assert env["SLURM_JOB_ID"] == str(job)
    assert env["SLURM_JOB_NODELIST"] == "node[1-2]"
    assert env["SLURM_NNODES"] == "2"
    gpus = env["CUDA_VISIBLE_DEVICES"].split(",")
    assert len(gpus) == 2 and len(set(gpus)) == 2
    assert env["SLURM_RESTART_COUNT"] == "0"
    assert env["SLURM_JOB_NAME"] == "twonode"


def test_exit_code_3_ends_failed(cli: Cli) -> None:
    job = cli.sbatch("#!/bin/sh\necho failing\nexit 3\n")
    assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "FAILED|3:0"
    assert (cli.workdir / f"slurm-{job}.out").read_text() == "failing\n"


def test_scancel_on_a_running_job_ends_cancelled(cli: Cli) -> None:
    job = cli.sbatch("#!/bin/sh\necho started\nsleep 300\n")
    cli.wait_state(job, ("RUNNING",))
    out = cli("scancel", str(job))
    assert out.returncode == 0, out.stderr
    row = cli.wait_state(job, ("CANCELLED",))
    # Slurm: the job's record 0:0, its batch step the signal that ended it
    assert row == f"CANCELLED by {os.getuid()}|0:0"
    steps = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State,ExitCode").stdout.split()
    assert f"{job}.batch|CANCELLED|0:15" in steps, steps


def test_twelve_one_gpu_jobs_never_run_more_than_eight_at_once(cli: Cli, tmp_path: Path) -> None:
    script = (
        "#!/bin/bash\n#SBATCH --gres=gpu:1\n"
        f"out={tmp_path}/spans.$SLURM_JOB_ID\n"
        'echo "$(date +%s.%N) start $CUDA_VISIBLE_DEVICES $SLURMD_NODENAME" >> $out\n'
        "sleep 3\n"
        'echo "$(date +%s.%N) end" >> $out\n'
    )
    jobs = [cli.sbatch(script) for _ in range(12)]
    for job in jobs:
        assert cli.wait_state(job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED|0:0"
    spans = []
    for job in jobs:
        lines = (tmp_path / f"spans.{job}").read_text().split("\n")
        start, end = float(lines[0].split()[0]), float(lines[1].split()[0])
        spans.append((start, end, lines[0].split()[3], lines[0].split()[2]))
    points = sorted([(s, 1) for s, _, _, _ in spans] + [(e, -1) for _, e, _, _ in spans])
    running = peak = 0
    for _, delta in points:
        running += delta
        peak = max(peak, running)
    assert 2 <= peak <= 8
    # No GPU of a node was used by two overlapping jobs.
    for a in spans:
        for b in spans:
            if a is not b and a[2:] == b[2:]:
                assert a[1] <= b[0] or b[1] <= a[0], f"GPU {a[3]} on {a[2]} shared"


def test_killing_the_scheduler_loses_nothing(cli: Cli, local_cluster: LocalCluster) -> None:
    marker = "#!/bin/bash\n#SBATCH --gres=gpu:4 -N 2\necho run $SLURM_RESTART_COUNT\nsleep 2\n"
    big = [cli.sbatch(marker) for _ in range(2)]
    small = [cli.sbatch("#!/bin/sh\n#SBATCH --gres=gpu:1\necho run\nsleep 1\n") for _ in range(4)]
    cli.wait_state(big[0], ("RUNNING",))
    local_cluster.restart("scheduler")
    after = [cli.sbatch("#!/bin/sh\necho run\n") for _ in range(2)]
    for job in big + small + after:
        assert cli.wait_state(job, ("COMPLETED", "FAILED"), timeout=90) == "COMPLETED|0:0"
        # Each job ran exactly once: one line of output, no duplicate launch.
        assert (cli.workdir / f"slurm-{job}.out").read_text().count("run") == 1
    ids = big + small + after
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_squeue_shows_pending_reasons(cli: Cli) -> None:
    blocker = cli.sbatch("#!/bin/sh\n#SBATCH -N 2 --gres=gpu:4\nsleep 4\n")
    cli.wait_state(blocker, ("RUNNING",))
    first = cli.sbatch("#!/bin/sh\n#SBATCH --gres=gpu:2\ntrue\n")
    second = cli.sbatch("#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n")
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline:
        text = cli("squeue", "-h", "-o", "%i %t %R").stdout
        if f"{first} PD (Resources)" in text and f"{second} PD (Priority)" in text:
            break
        time.sleep(0.2)
    assert f"{first} PD (Resources)" in text and f"{second} PD (Priority)" in text, text
    assert re.search(rf"^{blocker} R node\[1-2\]$", text, re.M), text
    for job in (blocker, first, second):
        cli.wait_state(job, ("COMPLETED",), timeout=60)


def test_commands_find_a_remote_cluster_through_the_environment(
    cli: Cli, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    from corral.libs.runtime.credentials import read_credentials

    creds = read_credentials(local_cluster.user_credentials)
    env = {k: v for k, v in cli.env.items() if k != "CORRAL_STATE_DIR"}
    env["CORRAL_STATE_DIR"] = str(tmp_path / "nothing-here")  # no local cluster to find
    env["CORRAL_NATS_URL"] = creds.url
    env["CORRAL_CREDENTIALS"] = str(local_cluster.user_credentials)
    remote = Cli(env=env, workdir=cli.workdir)
    job = remote.sbatch("#!/bin/sh\necho remote\n")
    assert remote.wait_state(job, ("COMPLETED",)) == "COMPLETED|0:0"
    # The credentials file alone names its cluster (its URL); without either, the command says how to find
    # one.
    alone = Cli(env={k: v for k, v in env.items() if k != "CORRAL_NATS_URL"}, workdir=cli.workdir)
    assert alone("squeue").returncode == 0
    lost = Cli(
        env={k: v for k, v in env.items() if k not in ("CORRAL_NATS_URL", "CORRAL_CREDENTIALS")},
        workdir=cli.workdir,
    )
    out = lost("squeue")
    assert out.returncode == 1 and "corral up" in out.stderr and out.stderr.count("\n") == 1


def test_sinfo_long_with_and_without_nodes(cli: Cli) -> None:
    # One of the most typed Slurm commands: the date of the report, then Slurm's long columns.
    for argv, header in (
        (["-l"], "TIMELIMIT   JOB_SIZE ROOT OVERSUBS     GROUPS  NODES       STATE NODELIST"),
        (["-N", "-l"], "STATE CPUS    S:C:T MEMORY TMP_DISK WEIGHT AVAIL_FE REASON"),
    ):
        out = cli("sinfo", *argv)
        assert out.returncode == 0, out.stderr
        date, title, *rows = out.stdout.splitlines()
        time.strptime(date, "%a %b %d %H:%M:%S %Y")
        assert header in title and rows, out.stdout
