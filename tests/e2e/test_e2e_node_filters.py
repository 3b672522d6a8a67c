"""End to end: squeue -w/-q and sinfo -n filter by node (hostlists) on a real cluster; bad hostlists fail."""

from __future__ import annotations

import time

import pytest
from e2e_cli import Cli

pytestmark = pytest.mark.e2e


def test_squeue_nodelist_and_sinfo_nodes(cli: Cli) -> None:
    job = cli.sbatch("#!/bin/sh\nsleep 300\n", "-w", "node2")
    try:
        # squeue, the scheduler's view: it needs the job running (sacct follows the log, and a busy run once
        # projected the whole 30 s run in one batch, past a poll for RUNNING)
        deadline = time.monotonic() + 60
        while cli("squeue", "-h", "-j", str(job), "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, cli("squeue", "-j", str(job)).stdout
            time.sleep(0.3)
        on_node2 = cli("squeue", "-h", "-o", "%i %N", "-w", "node[2-3]").stdout.split("\n")
        assert f"{job} node2" in on_node2
        assert str(job) not in cli("squeue", "-h", "-o", "%i", "-w", "node1").stdout.split()
        assert str(job) in cli("squeue", "-h", "-o", "%i", "-q", "normal").stdout.split()
        sinfo = cli("sinfo", "-h", "-N", "-o", "%N %t", "-n", "node2")
        assert sinfo.stdout.split("\n")[0] in ("node2 mix", "node2 alloc"), sinfo.stdout
    finally:
        cli("scancel", str(job))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["squeue", "-w", "node[1-"], 'squeue: error: invalid --nodelist "node[1-"'),
        (["sinfo", "-n", "node[1-"], 'sinfo: error: invalid --nodes "node[1-"'),
    ],
)
def test_bad_hostlists_fail_slurm_style(cli: Cli, argv: list[str], message: str) -> None:
    result = cli(*argv)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(message), result.stderr
