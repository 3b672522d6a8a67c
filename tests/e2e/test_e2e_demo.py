"""``corral demo`` as a newcomer runs it (the README's first command): a local cluster of its own, the four
moments, each one's evidence in what it prints, within 80 columns."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from e2e_cli import BIN

pytestmark = pytest.mark.e2e


def demo(tmp_path: Path, *options: str) -> str:
    """Run ``corral demo`` in a fresh state directory as a user's shell would; its standard output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    done = subprocess.run(
        [str(BIN / "corral"), "demo", "--state-dir", str(tmp_path / "state"), *options],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def sections(out: str) -> dict[int, str]:
    """The text of each moment, by number (from its heading to the next)."""
    parts = re.split(r"^(\d)/4  .*$", out, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_the_demo_plays_the_four_moments_and_shows_each_ones_evidence(tmp_path: Path) -> None:
    out = demo(tmp_path)
    wide = [line for line in out.splitlines() if len(line) > 80]
    assert not wide, wide
    moment = sections(out)
    assert sorted(moment) == [1, 2, 3, 4], out

    # 1. Four ranks on two distinct nodes, each with GPU indices of its own there, one MASTER_ADDR.
    ranks = re.findall(
        r"^ +(\d): rank \1/4 on (node\d) \(local rank \d\), GPUs ([\d,]+) -> (\S+)$", moment[1], re.M
    )
    assert len(ranks) == 4, moment[1]
    assert {node for _, node, _, _ in ranks} == {"node1", "node2"}
    for node in ("node1", "node2"):
        gpus = [set(g.split(",")) for _, n, g, _ in ranks if n == node]
        assert len(gpus) == 2 and not gpus[0] & gpus[1], ranks
    assert {master for *_, master in ranks} == {"node1"}, ranks
    assert "MASTER_ADDR=node1" in moment[1]

    # 2. The interactive step's output, labelled per task (0: and 1:), one task on each node.
    tasks = re.findall(r"^ +(\d): rank \1/2 on (node\d) GPUs [\d,]+", moment[2], re.M)
    assert sorted(tasks) == [("0", "node1"), ("1", "node2")], moment[2]

    # 3. The evaluation job ended before the large run's planned start; the large run started by then.
    planned = re.search(r"^ +\d+ +train-big +PD (\S+) ", moment[3], re.M)
    assert planned is not None, moment[3]
    rows = {
        name: (start, end)
        for name, start, end in re.findall(r"^ +\d+ +(\S+) +\S+ (\d{4}-\S+) (\d{4}-\S+)$", moment[3], re.M)
    }
    assert set(rows) == {"finetune", "train-big", "eval"}, moment[3]
    assert rows["eval"][0] < rows["train-big"][0], rows  # it started first, while the large run waited
    assert rows["eval"][1] <= planned.group(1), (rows, planned.group(1))
    assert rows["eval"][1] <= rows["train-big"][0] <= planned.group(1), (rows, planned.group(1))

    # 4. node1's agent and its job processes were killed; the second attempt runs with
    # SLURM_RESTART_COUNT=1, from the checkpoint the first one saved.
    killed = re.search(r"node1 is gone at step \d+ \((\d+) job processes killed", moment[4])
    assert killed is not None and int(killed.group(1)) >= 2, moment[4]  # the batch step's and a task's
    resumed = re.search(r"SLURM_RESTART_COUNT=1: resumed from checkpoint step (\d+)", moment[4])
    assert resumed is not None, moment[4]
    step = int(resumed.group(1))
    assert step > 0
    assert f"0: step {step}/8 done, checkpoint saved" in moment[4]  # the first attempt got that far
    assert re.search(r"^ +gpu\* +up +\S+ +1 +down\*? node1$", moment[4], re.M), moment[4]  # sinfo
    # sacct -D: the first attempt ended by the node failure, the second completed, both on 8 GPUs.
    attempts = re.findall(r"^ +\d+ +(NODE_FAIL|COMPLETED) +node\[1-2\] +\S*gres/gpu=8\S* ", moment[4], re.M)
    assert attempts == ["NODE_FAIL", "COMPLETED"], moment[4]
    assert "job_requeued" in moment[4] and "node_down node1" in moment[4]  # corral audit
    assert "attempt 0" in moment[4] and "attempt 1" in moment[4]  # corral trace


def test_only_plays_one_moment(tmp_path: Path) -> None:
    out = demo(tmp_path, "--fast")
    assert sorted(sections(out)) == [1], out
    assert "moment 1" in out and "moment 2" not in out
