"""Topology through the real commands and services: a local cluster has no blocks, so each node is its own."""

from __future__ import annotations

import pytest
from e2e_cli import Cli

pytestmark = pytest.mark.e2e


def test_a_segment_no_block_can_hold_is_refused_at_submit(cli: Cli) -> None:
    out = cli("sbatch", "-N", "2", "--segment=2", stdin="#!/bin/sh\ntrue\n")
    assert out.returncode != 0 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sbatch: error:") and "--segment=2" in lines[0], out.stderr


def test_switches_bind_until_their_wait_lapses_then_the_job_spreads(cli: Cli) -> None:
    job = cli.sbatch("#!/bin/sh\n#SBATCH -N 2 --switches=1@0:03 -t 1:00\necho spread\n")
    shown = cli("scontrol", "show", "job", str(job)).stdout
    assert "Switches=1@00:00:03" in shown, shown
    # Two nodes are two blocks: the job waits its 3 s, then runs over both.
    assert cli.wait_state(job, ("COMPLETED",), timeout=60) == "COMPLETED|0:0"
    row = cli("sacct", "-X", "-P", "-n", "-o", "Submit,Start,NNodes", "-j", str(job)).stdout.strip()
    submit, start, nodes = row.split("|")
    assert nodes == "2" and start > submit, row
