"""A chatty step keeps only its unforwarded output on the node's disk: the agent frees the disk space of
what it has forwarded from the task's spool file, and every byte still reaches the job's output."""

from __future__ import annotations

import os
import time

import pytest
from e2e_cli import BIN, Cli, wait_for_line

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e

MIB = 1 << 20
#: 24 MiB of 100-byte lines, then a pause while the test looks at the spool file.
XS = f'head -c {24 * MIB // 100 * 99} /dev/zero | tr "\\0" x | fold -w 99'
SCRIPT = f"""#!/bin/bash
#SBATCH -o spool-%j.out -t 5:00
{BIN}/srun bash -c '{XS}; echo; echo written; sleep 4'
"""


def test_forwarded_spool_output_gives_its_disk_space_back(local_cluster: LocalCluster, cli: Cli) -> None:
    job = cli.sbatch(SCRIPT)
    out = cli.workdir / f"spool-{job}.out"
    wait_for_line(out, "written", timeout=60)
    node = cli("squeue", "-h", "-j", str(job), "-o", "%N").stdout.strip()
    spool = local_cluster.state_dir / "agents" / node / "stepd" / f"{job}.0.0" / "out.0"
    deadline = time.monotonic() + 3
    while True:
        stat = os.stat(spool)
        if stat.st_blocks * 512 < 4 * MIB or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert stat.st_size >= 24 * MIB - 100  # the task wrote it all there
    assert stat.st_blocks * 512 < 4 * MIB, stat  # but what was forwarded no longer takes disk space
    assert cli.wait_state(job, ("COMPLETED", "FAILED")) == "COMPLETED|0:0"
    lines = out.read_text().splitlines()
    assert lines[-1] == "written" and len(lines) == 24 * MIB // 100 + 1
    assert set(lines[:-1]) == {"x" * 99}
