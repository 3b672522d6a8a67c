"""sbatch --test-only: the job is validated like a submission and its start estimated by the scheduler;
nothing is submitted (the next real job gets the next id, and no job shows up anywhere)."""

from __future__ import annotations

import re

import pytest
from e2e_cli import Cli

pytestmark = pytest.mark.e2e

SCRIPT = "#!/bin/bash\n#SBATCH -J probe\ntrue\n"


def test_test_only_estimates_the_start_and_submits_nothing(cli: Cli) -> None:
    before = cli.sbatch(SCRIPT, "-t", "1:00")
    out = cli("sbatch", "--test-only", "--gres=gpu:1", "-c", "2", "-t", "1:00", stdin=SCRIPT)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    line = re.fullmatch(
        r"sbatch: Job (\d+) to start at (\S+) using (\d+) processors on nodes (node\d) in partition (\w+)\n",
        out.stderr,
    )
    assert line is not None, out.stderr
    assert line.group(3) == "2"
    after = cli.sbatch(SCRIPT, "-t", "1:00")
    assert after == before + 1  # no id was taken
    listed = cli("squeue", "-h", "-n", "probe", "-o", "%i").stdout.split()
    accounted = cli("sacct", "-n", "-X", "-P", "--name", "probe", "-o", "JobID").stdout.split()
    assert set(listed) <= {str(before), str(after)}, listed
    assert set(accounted) <= {str(before), str(after)}, accounted


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("-p", "nosuch"), "invalid partition"),
        (("--gres=gpu:99",), "Requested node configuration is not available"),
    ],
    ids=["unknown-partition", "can-never-fit"],
)
def test_test_only_refuses_what_a_submission_would(cli: Cli, options: tuple[str, ...], message: str) -> None:
    out = cli("sbatch", "--test-only", *options, stdin=SCRIPT)
    assert out.returncode != 0
    assert out.stderr.startswith("sbatch: error: Job submit/allocate failed: "), out.stderr
    assert message.lower() in out.stderr.lower(), out.stderr
