"""GPU accounting end to end: a 2-GPU job requeued once and another 2-GPU job, then sacct -D and sreport.

Issue 11's "done means": ``sacct -D`` shows both runs of the requeued job, ``AllocTRES`` names
``gres/gpu=2``, and sreport's GPU usage of the account equals the sum over the jobs' records of
ElapsedRaw x GPUs (sreport in seconds; minutes and hours are the same seconds cut to whole units), and
root's row is the sum of the top accounts' rows.
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_cli import BIN, Cli, own_cluster

from corral.libs.config.cluster import local_config_text

pytestmark = pytest.mark.e2e

#: The account of this test's jobs, on a cluster of its own.
ACCOUNT = "gpuacct"


def sreport(cli: Cli, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run sreport as a user would; from its module when the environment has no ``sreport`` script yet."""
    if (BIN / "sreport").exists():
        return cli("sreport", *argv)
    return subprocess.run(
        [sys.executable, "-m", "corral.cli.sreport", *argv],
        env=cli.env,
        cwd=cli.workdir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def gpu_seconds(cli: Cli, job: int) -> list[tuple[str, int, str]]:
    """Each record of the job (``sacct -D -X``): its state, ElapsedRaw x GPUs, and AllocTRES."""
    out = cli("sacct", "-j", str(job), "-D", "-X", "-P", "-n", "-o", "State,ElapsedRaw,AllocTRES,AllocGRES")
    assert out.returncode == 0, out.stderr
    records = []
    for line in out.stdout.splitlines():
        state, elapsed, tres, gres = line.split("|")
        assert gres == "gpu:2", line
        gpus = int(dict(item.split("=") for item in tres.split(","))["gres/gpu"])
        records.append((state, int(elapsed) * gpus, tres))
    return records


@pytest.fixture
def accounted(tmp_path: Path) -> Iterator[Cli]:
    """A 2-node x 4-GPU cluster of our own whose one account, ACCOUNT, only this test's jobs are charged to
    (an account must be configured for -A to name it)."""
    cpus = max(os.cpu_count() or 2, 2) * 4
    nodes = local_config_text("local", ["node1", "node2"], 4, cpus, 64 * 1024)
    config = f'{nodes}\n[[accounts]]\nname = "{ACCOUNT}"\nusers = ["{getpass.getuser()}"]\n'
    with own_cluster(tmp_path, config, nodes=2, gpus_per_node=4) as cli:
        yield cli


def test_requeued_gpu_job_shows_every_run_and_sreport_sums_the_gpu_seconds(accounted: Cli) -> None:
    cli, account = accounted, ACCOUNT
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 5))
    twice = cli.sbatch(
        f"#!/bin/bash\n#SBATCH -t 5:00 --gres=gpu:2 -A {account}\n"
        'if [ "$SLURM_RESTART_COUNT" = 0 ]; then sleep 120; fi\nsleep 2\n'
    )
    once = cli.sbatch(f"#!/bin/bash\n#SBATCH -t 5:00 --gres=gpu:2 -A {account}\nsleep 3\n")
    cli.wait_state(twice, ("RUNNING",))
    time.sleep(2)  # the first run lasts a few seconds
    assert cli("scontrol", "requeue", str(twice)).returncode == 0
    cli.wait_state(twice, ("COMPLETED",), timeout=120)
    cli.wait_state(once, ("COMPLETED",), timeout=60)

    runs = gpu_seconds(cli, twice)
    assert [state for state, _, _ in runs] == ["REQUEUED", "COMPLETED"], runs
    assert all("gres/gpu=2" in tres for _, _, tres in runs), runs
    assert runs[0][1] >= 2 * 2  # two GPUs for at least two seconds
    # Without -D only the latest record.
    latest = cli("sacct", "-j", str(twice), "-X", "-P", "-n", "-o", "State").stdout.split()
    assert latest == ["COMPLETED"]
    expected = sum(seconds for _, seconds, _ in runs + gpu_seconds(cli, once))

    window = [f"start={start}", "end=now+1hours", f"accounts={account}"]
    report = "cluster", "AccountUtilizationByUser"
    out = sreport(cli, "-P", "-n", "-t", "seconds", "--tres=gres/gpu", *report, *window)
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines()]
    by_row = {(acct, login): (tres, used) for _, acct, login, _, tres, used in rows}
    user = cli.env.get("USER") or next(login for _, login in by_row if login)
    assert by_row[(account, "")] == ("gres/gpu", str(expected)), rows
    assert by_row[(account, user)] == ("gres/gpu", str(expected)), rows
    assert ("root", "") not in by_row, rows  # accounts= shows that subtree only, as Slurm's
    # Slurm's default unit is minutes; -t hours cuts the same seconds to whole hours.
    for unit, divisor in (("minutes", 60), ("hours", 3600)):
        out = sreport(cli, "-P", "-n", "-t", unit, "--tres=gres/gpu", *report, *window)
        assert out.stdout.splitlines()[0].split("|")[-1] == str(expected // divisor), out.stdout
    # Over every account (tree: a top account is indented one space), root's row is their sum.
    out = sreport(cli, "-P", "-n", "-t", "seconds", "--tres=gres/gpu", *report, "tree", *window[:2])
    rows = [line.split("|") for line in out.stdout.splitlines()]
    assert rows[0][1:3] == ["root", ""], rows
    tops = [int(used) for _, acct, login, _, _, used in rows if acct == f" {acct.strip()}" and not login]
    assert [acct for _, acct, _, _, _, _ in rows].count(f" {account}") == 1, rows
    assert int(rows[0][5]) == sum(tops), rows
    # The fixed-width report has Slurm's banner.
    out = sreport(cli, "-t", "hours", "--tres=gres/gpu", *report, *window)
    lines = out.stdout.splitlines()
    assert lines[0] == "-" * 80 and lines[1].startswith("Cluster/Account/User Utilization "), lines
    assert lines[2] == "Usage reported in TRES Hours", lines
    top = sreport(cli, "-P", "-n", "-t", "seconds", "--tres=gres/gpu", "user", "TopUsage", *window)
    assert top.stdout.splitlines()[0].split("|")[-1] == str(expected), top.stdout
    util = sreport(cli, "-P", "-t", "seconds", "--tres=gres/gpu", "cluster", "utilization", *window[:2])
    assert util.returncode == 0, util.stderr
    header, values = util.stdout.splitlines()[4:6]
    assert header == "Cluster|TRES Name|Allocated|Down|PLND Down|Idle|Planned|Reported", util.stdout
    cells = values.split("|")
    assert int(cells[2]) >= expected  # every GPU job of the window, others' included
    # 2 nodes x 4 GPUs since the window's start: at least the allocated GPU-seconds (CI once saw 36 < 8 x 5,
    # the window having begun under 5 s before)
    assert int(cells[7]) >= int(cells[2])
    # The end defaults to today 00:00, as Slurm's: before a start of now, which is refused.
    refused = sreport(cli, "cluster", "utilization", f"start={start}")
    assert refused.returncode == 1 and "must be after its start" in refused.stderr, refused
