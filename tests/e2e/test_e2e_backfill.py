"""The seed's promise: a short eval job slips into idle GPUs while the big training run waits."""

from __future__ import annotations

import pytest
from e2e_cli import Cli

pytestmark = pytest.mark.e2e


def states(cli: Cli, *jobs: int) -> dict[int, str]:
    out = cli("squeue", "-h", "-j", ",".join(map(str, jobs)), "-o", "%i %T %r").stdout
    return {int(line.split()[0]): " ".join(line.split()[1:]) for line in out.strip().splitlines()}


def test_short_job_backfills_while_the_big_job_waits(cli: Cli) -> None:
    first = cli.sbatch("#!/bin/sh\n#SBATCH -J busy --gres=gpu:4 -t 0:40\nsleep 8\n")
    cli.wait_state(first, ("RUNNING",))
    big = cli.sbatch("#!/bin/sh\n#SBATCH -J train -N 2 --gres=gpu:4 -t 1:00\necho trained\n")
    short = cli.sbatch("#!/bin/sh\n#SBATCH -J eval --gres=gpu:2 -t 0:05\necho evaluated\n")
    long = cli.sbatch("#!/bin/sh\n#SBATCH -J sweep --gres=gpu:2 -t 10:00\necho swept\n")
    # The short job ends before the big job's reservation: it starts at once, on the idle node.
    assert cli.wait_state(short, ("COMPLETED",), timeout=20) == "COMPLETED|0:0"
    seen = states(cli, big, long)
    assert seen[big] == "PENDING Resources", seen
    # The long job would delay the big one: it waits behind it.
    assert seen[long] == "PENDING Priority", seen
    planned = cli("squeue", "--start", "-h", "-j", str(big), "-o", "%i %S").stdout.split()
    assert planned[0] == str(big) and planned[1] not in ("N/A", ""), planned
    for job in (first, big, long):
        assert cli.wait_state(job, ("COMPLETED",), timeout=60) == "COMPLETED|0:0"
    starts = {
        int(row.split("|")[0]): row.split("|")[1]
        for row in cli("sacct", "-X", "-P", "-n", "-o", "JobID,Start", "-j", f"{big},{long},{short}")
        .stdout.strip()
        .splitlines()
    }
    # Backfilled before the big job, while the long one started only after it.
    assert starts[short] < starts[big] <= starts[long], starts
