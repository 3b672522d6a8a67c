"""End to end: a step's tasks end with their run (cancel, time limit, requeue), and Ctrl-C on a real srun
process forwards SIGINT to the tasks (twice within a second kills the step)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e_cli import BIN, Cli, alive

pytestmark = pytest.mark.e2e

PATH_LINE = f'export PATH="{BIN}:$PATH"\n'


def task_pids(workdir: Path, job: int, ntasks: int, timeout: float = 30.0) -> list[int]:
    """The pids the step's tasks wrote (``pid-<job>-<task>``), once all are there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [workdir / f"pid-{job}-{t}" for t in range(ntasks)]
        texts = [f.read_text().strip() if f.exists() else "" for f in files]
        if all(texts):
            return [int(t) for t in texts]
        time.sleep(0.2)
    raise AssertionError(f"the tasks of job {job} did not start in {timeout}s")


# Two tasks on two nodes; each records its pid and sleeps long. After a requeue the rerun does nothing.
STEP_SCRIPT = (
    "#!/bin/bash\n#SBATCH -o out-%j.txt\n"
    + PATH_LINE
    + '[ "$SLURM_RESTART_COUNT" = 0 ] || exit 0\n'
    + "srun -N2 -n2 bash -c 'echo $$ > pid-$SLURM_JOB_ID-$SLURM_PROCID; exec sleep 300'\n"
)


@pytest.mark.parametrize(
    ("end", "options", "final"),
    [
        ("scancel", (), "CANCELLED"),
        ("time limit", ("--time=0:08",), "TIMEOUT"),
        ("scontrol requeue", ("--requeue",), "COMPLETED"),
    ],
    ids=["cancel", "timeout", "requeue"],
)
def test_step_tasks_end_with_their_run(cli: Cli, end: str, options: tuple[str, ...], final: str) -> None:
    job = cli.sbatch(STEP_SCRIPT, "-N2", "-n2", *options)
    pids = task_pids(cli.workdir, job, 2)
    assert all(alive(p) for p in pids)
    if end == "scancel":
        assert cli("scancel", str(job)).returncode == 0
    elif end == "scontrol requeue":
        assert cli("scontrol", "requeue", str(job)).returncode == 0
    deadline = time.monotonic() + 40
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), f"step tasks of job {job} outlived its run ({end})"
    assert cli.wait_state(job, (final,)).startswith(final)
    if end != "scontrol requeue":  # the rerun has no step: sacct shows the latest attempt's steps only
        step = cli("sacct", "-j", str(job), "-P", "-n", "-o", "JobID,State").stdout.splitlines()
        assert f"{job}.0|CANCELLED" in step, step


def start_srun(cli: Cli, *argv: str) -> subprocess.Popen[str]:
    """A real srun process outside an allocation, its output on pipes."""
    return subprocess.Popen(
        [str(BIN / "srun"), *argv],
        env=cli.env,
        cwd=cli.workdir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_until(proc: subprocess.Popen[str], count: int, prefix: str) -> list[str]:
    """Read stdout lines until ``count`` start with ``prefix``."""
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:
        if line.startswith(prefix):
            seen.append(line.strip())
            if len(seen) == count:
                return seen
    raise AssertionError(f"srun ended before printing {count} {prefix!r} lines: {seen}")


def test_ctrl_c_forwards_sigint_to_the_tasks(cli: Cli) -> None:
    task = (
        'trap "echo got-INT $SLURM_PROCID; exit 0" INT; echo ready $SLURM_PROCID; '
        "while true; do sleep 0.1; done"
    )
    proc = start_srun(cli, "-N2", "-n2", "bash", "-c", task)
    try:
        read_until(proc, 2, "ready")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert sorted(line for line in out.splitlines() if line.startswith("got-INT")) == [
        "got-INT 0",
        "got-INT 1",
    ], (out, err)
    assert "interrupt (one more within 1 sec to abort)" in err
    assert proc.returncode == 0, err


def test_second_ctrl_c_within_a_second_kills_the_step(cli: Cli) -> None:
    task = 'trap "" INT; echo ready $SLURM_PROCID $$; while true; do sleep 0.1; done'
    proc = start_srun(cli, "-N2", "-n2", "bash", "-c", task)
    try:
        ready = read_until(proc, 2, "ready")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert time.monotonic() - started < 15
    assert "forcing job termination" in err, err
    assert proc.returncode == 128 + signal.SIGTERM, err
    for line in ready:
        assert not alive(int(line.split()[2])), f"task left running: {line}"


def test_lost_task_exits_end_in_the_steps_recorded_end(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """srun's subscription is pointed elsewhere, so no output or exit of the step reaches it (as if lost):
    its liveness check finds the step over at the agent and takes the exit from the step's accounting."""
    import os

    from corral.cli import srun_step
    from corral.cli.client import find_cluster
    from corral.libs.runtime import nats_request
    from corral.schemas.steps import StepLaunch

    started_file = cli.workdir / f"lost-exits-{os.urandom(4).hex()}.started"
    job = cli.sbatch(f"#!/bin/sh\ntouch {started_file}\nsleep 60\n", "-N1")
    try:
        # The script's own mark, not sacct's RUNNING: RUNNING is the allocation, and until the batch node's
        # agent has launched the run it refuses a step as "not running on" it (CI saw that window).
        deadline = time.monotonic() + 60
        while not started_file.exists():
            assert time.monotonic() < deadline, f"job {job}'s script did not start"
            time.sleep(0.05)
        key = os.urandom(8).hex()
        subscribe = nats_request.Connection.subscribe

        def elsewhere(self: nats_request.Connection, subject: str, timeout: float = 10.0) -> None:
            subscribe(self, subject.replace(key, "nobody-publishes-here"), timeout)

        monkeypatch.setattr(nats_request.Connection, "subscribe", elsewhere)
        monkeypatch.setattr(srun_step, "LIVENESS_S", 1.0)
        launch = StepLaunch(
            job_id=job, key=key, argv=["sh", "-c", "exit 3"], cwd=str(cli.workdir), stdin=False
        )
        node = cli("squeue", "-h", "-j", str(job), "-o", "%N").stdout.strip()
        session = srun_step.StepSession(find_cluster(cli.env), node, launch, label=False, command="srun")
        started = time.monotonic()
        assert session.run() == 3
        assert time.monotonic() - started < 20
    finally:
        cli("scancel", str(job))
