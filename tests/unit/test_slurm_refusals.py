"""sbatch/srun/salloc option and submission errors in Slurm 22.05's form: its first line, its exit status,
then Corral's hint (the field and the fix) on the next line (issue 15, item 10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.cli import sbatch
from corral.cli.errors import CliError, run_command
from corral.cli.slurm_refusals import Refusal, refusal

pytestmark = pytest.mark.unit

TIME_HINT = 'invalid --time "abc": use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S'
GRES_HINT = (
    'invalid --gres "gpu:-1": use NAME[:TYPE][:COUNT][,...] (e.g. gpu, gpu:2, gpu:h100:4, gpu:2,nic:1)'
)


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.sh").write_text("#!/bin/sh\ntrue\n")
    return "s.sh"


@pytest.mark.parametrize(
    ("argv", "err", "status"),
    [
        (
            ["--bogus"],
            "sbatch: unrecognized option '--bogus'\nTry \"sbatch --help\" for more information\n",
            255,
        ),
        (
            ["-J"],
            "sbatch: option requires an argument -- 'J'\nTry \"sbatch --help\" for more information\n",
            255,
        ),
        (
            ["--time=abc", "s.sh"],
            f"sbatch: error: Invalid --time specification\nsbatch: error: {TIME_HINT}\n",
            255,
        ),
        (
            ["--gres=gpu:-1", "s.sh"],
            "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification\n"
            f"sbatch: error: {GRES_HINT}\n",
            1,
        ),
        (
            ["-N", "x", "s.sh"],
            'sbatch: error: "x" is not a valid node count\n'
            'sbatch: error: invalid --nodes "x": use a whole number of at least 1\n',
            255,
        ),
        (
            ["-n", "x", "s.sh"],
            'sbatch: error: Invalid numeric value "x" for --ntasks.\n'
            'sbatch: error: invalid --ntasks "x": use a whole number of at least 1\n',
            1,
        ),
    ],
    ids=["bogus", "missing argument", "time", "gres", "nodes", "ntasks"],
)
def test_sbatch_prints_slurms_line_then_the_hint(
    argv: list[str], err: str, status: int, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script == "s.sh"
    assert sbatch.main(argv) == status
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", err)


def test_a_directive_error_keeps_the_line_it_is_on() -> None:
    assert refusal("sbatch", "unrecognized option '--foo' (#SBATCH line 2)") == Refusal(
        ("sbatch: unrecognized option '--foo'", 'Try "sbatch --help" for more information'),
        "unrecognized option '--foo' (#SBATCH line 2)",
        255,
    )


def test_a_gateway_refusal_is_slurms_line_then_corrals_reason() -> None:
    """``-p nosuch``: the gateway's text starts with slurmctld's; Slurm's line ends there."""
    said = "Batch job submission failed: Invalid partition name specified: partition 'nosuch' does not exist"
    assert refusal("sbatch", said) == Refusal(
        ("sbatch: error: Batch job submission failed: Invalid partition name specified",),
        "partition 'nosuch' does not exist",
        1,
    )
    assert refusal("srun", said).slurm == (  # type: ignore[union-attr]
        "srun: error: Unable to allocate resources: Invalid partition name specified",
    )
    assert refusal("salloc", said).slurm == (  # type: ignore[union-attr]
        "salloc: error: Job submit/allocate failed: Invalid partition name specified",
    )
    test_only = "Job submit/allocate failed: Invalid qos specification: QOS 'x' does not exist"
    assert refusal("sbatch", test_only) == Refusal(
        ("sbatch: error: Job submit/allocate failed: Invalid qos specification",), "QOS 'x' does not exist", 1
    )


def test_other_errors_and_other_commands_keep_corrals_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert refusal("sbatch", "Unable to open file s.sh") is None
    assert refusal("squeue", "unrecognized option '--bogus'") is None

    def refused(argv: list[str]) -> int:
        raise CliError("unrecognized option '--bogus'")

    assert run_command("squeue", refused, []) == 1
    assert capsys.readouterr().err == "squeue: error: unrecognized option '--bogus'\n"
    assert run_command("srun", refused, []) == 255
    assert capsys.readouterr().err.splitlines() == [
        "srun: unrecognized option '--bogus'",
        'Try "srun --help" for more information',
    ]
