"""Time limits: --signal=[B:]SIG@T once T seconds before the limit (to the job's step tasks, or with B: to
the batch shell), then SIGTERM to every process of the job, SIGKILL after KillWait; state TIMEOUT."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from agent_cluster import agent_cluster
from e2e_cli import BIN, Cli

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e

KILL_WAIT = 2

# The batch shell, a step task (srun) and a plain child of the script log the signals they get (with
# seconds since the start) and ignore TERM, so only the SIGKILL after KillWait ends them.
LOGGER = (
    't0=$1; trap "echo $2 USR1 \\$(echo \\"\\$(date +%s.%N) - $t0\\" | bc)" USR1; trap "" TERM; '
    "while :; do sleep 0.1; done"
)
SCRIPT = f"""#!/bin/bash
export PATH="{BIN}:$PATH"
t0=$(date +%s.%N)
now() {{ echo "$(date +%s.%N) - $t0" | bc; }}
srun bash -c '{LOGGER}' step "$t0" step &
bash -c '{LOGGER}' child "$t0" child &
trap 'echo batch USR1 $(now)' USR1
trap 'echo batch TERM $(now)' TERM
while :; do echo tick $(now); sleep 0.25; done
"""


@pytest.fixture(scope="module")
def limits_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Cli]]:
    """A cluster with KillWait = 2 s."""
    with agent_cluster(tmp_path_factory.mktemp("limits"), kill_wait=KILL_WAIT) as pair:
        yield pair


def events(text: str) -> list[tuple[str, float]]:
    """(what, seconds since start) of each line of the job's output; bash's reports of its ``sleep``s
    killed by the signal ("User defined signal 1", "Terminated") are skipped."""
    out = []
    for line in text.splitlines():
        *what, at = line.split()
        if what and what[0] in ("tick", "batch", "child", "step"):
            out.append((" ".join(what), float(at)))
    return out


@pytest.mark.parametrize("batch_only", [False, True], ids=["all-processes", "batch-shell-only"])
def test_warning_signal_then_term_then_kill_and_timeout(
    limits_cluster: tuple[LocalCluster, Cli], batch_only: bool
) -> None:
    _, cli = limits_cluster
    out = cli.workdir / f"limit-{batch_only}.out"
    flag = "B:" if batch_only else ""
    job = cli.sbatch(SCRIPT, "--time=0:08", f"--signal={flag}USR1@4", "-o", str(out))
    row = cli.wait_state(job, ("TIMEOUT", "COMPLETED", "FAILED", "CANCELLED"), timeout=40)
    assert row.split("|")[0] == "TIMEOUT", row
    seen = events(out.read_text())
    usr1 = [at for what, at in seen if what == "batch USR1"]
    term = [at for what, at in seen if what == "batch TERM"]
    ticks = [at for what, at in seen if what == "tick"]
    # Once, ~4 s before the 8 s limit: with B: to the batch shell only, else to the job's step tasks only
    # (Slurm); a process the script started without srun gets it in neither case.
    warned = [at for what, at in seen if what == ("batch USR1" if batch_only else "step USR1")]
    assert len(warned) == 1 and 3.0 <= warned[0] <= 5.5, seen
    assert len(usr1) == (1 if batch_only else 0), seen
    assert [what for what, _ in seen if what == "step USR1"] == ([] if batch_only else ["step USR1"]), seen
    assert not [what for what, _ in seen if what == "child USR1"], seen
    assert len(term) == 1 and 7.5 <= term[0] <= 9.5, seen  # at the limit
    # Still alive after TERM (it ignores it) until SIGKILL, KillWait later.
    assert KILL_WAIT - 0.6 <= ticks[-1] - term[0] <= KILL_WAIT + 1.0, seen
    # squeue shows a just-ended job for a while (Slurm's MinJobAge), as TO.
    assert cli("squeue", "-h", "-j", str(job), "-o", "%t").stdout.strip() in ("TO", "")
