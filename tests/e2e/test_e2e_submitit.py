"""submitit (the released package, unmodified) against a local cluster of real processes.

submitit writes a batch script (``#SBATCH --signal=USR2@90 --open-mode=append --wckey=submitit ...``) that
runs its worker under ``srun --unbuffered --output ... --error ...``, submits it with ``sbatch``, polls
``sacct -o JobID,State,NodeList --parsable2 -j ...``, cancels with ``scancel`` and, when a ``Checkpointable``
gets USR2 (preemption or the time-limit warning), checkpoints and calls ``scontrol requeue`` from inside the
job, which must rerun with the same id and ``SLURM_RESTART_COUNT=1``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_cli import Cli

submitit = pytest.importorskip("submitit")

pytestmark = pytest.mark.e2e


@pytest.fixture
def slurm_env(slurm_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared ``slurm_env`` (conftest.py), and the jobs unpickle this module's functions by reference:
    they import it from here."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    return slurm_env


def add(a: int, b: int) -> tuple[int, str]:
    """A job's work: a sum, and the job id it ran as."""
    return a + b, os.environ["SLURM_JOB_ID"]


def timed(i: int) -> tuple[int, float, float, str]:
    """An array task's work: when it ran, and its array index."""
    start = time.time()
    time.sleep(1.5)
    return i, start, time.time(), os.environ["SLURM_ARRAY_TASK_ID"]


class Counter(submitit.helpers.Checkpointable):  # type: ignore[misc]
    """Counts to ``n``, one step per half second, noting each step and its run in ``log``; submitit
    pickles it (with how far it got) when USR2 comes, and the requeued run goes on from there."""

    def __init__(self) -> None:
        self.done = 0

    def __call__(self, log: str, n: int) -> tuple[int, str]:
        while self.done < n:
            with open(log, "a") as fh:
                fh.write(f"{self.done} {os.environ['SLURM_RESTART_COUNT']}\n")
            time.sleep(0.5)
            self.done += 1
        return self.done, os.environ["SLURM_RESTART_COUNT"]


class FourMore(Counter):
    """A Counter whose checkpoint leaves four more steps to the requeued run."""

    def checkpoint(self, log: str, n: int) -> Any:
        return super().checkpoint(log, self.done + 4)


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """How many of the spans ran at once, at most."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


def test_submit_a_function_and_get_its_result(slurm_env: Path, cli: Cli) -> None:
    executor = submitit.AutoExecutor(folder=slurm_env / "jobs")
    assert executor.cluster == "slurm"  # it found srun on PATH
    executor.update_parameters(timeout_min=5)
    job = executor.submit(add, 2, 3)
    assert job.result() == (5, job.job_id)
    assert cli.wait_state(int(job.job_id), ("COMPLETED",)) == "COMPLETED|0:0"
    assert job.watcher.get_state(job.job_id, mode="force") == "COMPLETED"
    # The srun step and the batch step are in sacct, as submitit's log paths expect (%j_%t).
    steps = cli("sacct", "-j", job.job_id, "-P", "-n", "-o", "JobID,State").stdout.split()
    assert steps == [f"{job.job_id}|COMPLETED", f"{job.job_id}.batch|COMPLETED", f"{job.job_id}.0|COMPLETED"]
    assert "Starting with JobEnvironment" in job.stdout()


def test_map_array_holds_its_parallelism(slurm_env: Path) -> None:
    executor = submitit.AutoExecutor(folder=slurm_env / "array" / "%j")
    executor.update_parameters(timeout_min=5, slurm_array_parallelism=2)
    jobs = executor.map_array(timed, range(6))
    array_id = jobs[0].job_id.split("_")[0]
    assert [job.job_id for job in jobs] == [f"{array_id}_{i}" for i in range(6)]
    results = [job.result() for job in jobs]
    assert [(i, index) for i, _, _, index in results] == [(i, str(i)) for i in range(6)]
    # %2: never more than two tasks at once, and two did run together (the cluster has room for six).
    assert max_overlap([(start, end) for _, start, end, _ in results]) == 2


def test_cancel(slurm_env: Path, cli: Cli) -> None:
    executor = submitit.AutoExecutor(folder=slurm_env / "cancel")
    executor.update_parameters(timeout_min=5)
    job = executor.submit(time.sleep, 300)
    cli.wait_state(int(job.job_id), ("RUNNING",))
    job.cancel()
    deadline = time.monotonic() + 30
    while (state := job.watcher.get_state(job.job_id, mode="force")) == "RUNNING":
        assert time.monotonic() < deadline, state
        time.sleep(0.3)
    assert state.startswith("CANCELLED"), state
    assert job.done()


def run_lines(log: Path) -> list[tuple[int, int]]:
    """(step, run) of each line a Counter wrote."""
    return [(int(a), int(b)) for a, b in (line.split() for line in log.read_text().splitlines())]


def check_resumed(job: Any, log: Path, n: int, cli: Cli) -> None:
    """The job finished in its second run, from the first run's checkpoint, with the same id."""
    assert job.result() == (n, "1")
    lines = run_lines(log)
    first = [step for step, run in lines if run == 0]
    second = [step for step, run in lines if run == 1]
    assert first and second and first == list(range(len(first))), lines
    # The second run starts where the checkpoint left off (the step under way when USR2 came reruns).
    assert second == list(range(second[0], n)) and second[0] in (first[-1], first[-1] + 1), lines
    assert cli.wait_state(int(job.job_id), ("COMPLETED",)) == "COMPLETED|0:0"
    shown = cli("scontrol", "show", "job", job.job_id).stdout
    assert "Restarts=1" in shown, shown
    # --open-mode=append: both runs' logs are in the one file.
    assert job.stdout().count("Starting with JobEnvironment") == 2


def test_preempted_checkpointable_requeues_itself_and_resumes(slurm_env: Path, cli: Cli) -> None:
    executor = submitit.AutoExecutor(folder=slurm_env / "preempt")
    executor.update_parameters(timeout_min=5)
    log = slurm_env / "preempt.log"
    job = executor.submit(Counter(), str(log), 12)
    deadline = time.monotonic() + 60
    while not (log.exists() and len(log.read_text().splitlines()) >= 3):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # submitit's own preemption trigger: scancel --signal SIGTERM, then --signal USR2.
    job._interrupt()
    check_resumed(job, log, 12, cli)


def test_time_limit_warning_checkpoints_and_requeues(slurm_env: Path, cli: Cli) -> None:
    # --time=1 --signal=USR2@50: the warning comes 10 s into the run, and the checkpoint leaves the second run
    # four steps (2 s), however far the first got. (With the warning 5 s in and a fixed count, a loaded
    # machine once started submitit's worker, and its USR2 handler, too late: USR2's default action killed
    # it, FAILED 140:0; and a slow first run left a second run too long for its own warning.)
    executor = submitit.AutoExecutor(folder=slurm_env / "timeout")
    executor.update_parameters(timeout_min=1, slurm_signal_delay_s=50)
    log = slurm_env / "timeout.log"
    job = executor.submit(FourMore(), str(log), 10_000)
    n, _ = job.result()
    check_resumed(job, log, n, cli)
    first = [step for step, run in run_lines(log) if run == 0]
    assert 3 <= len(first) <= 21, first  # ~19 half-second steps before the warning when the machine is idle
