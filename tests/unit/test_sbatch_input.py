"""sbatch's refusals of input that used to be accepted and then fail the job: a NUL byte in the script, an
output directory the user cannot write; and the bound on an ``#SBATCH`` line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from corral.cli.errors import CliError
from corral.cli.sbatch_args import build_submission, parse_command_line
from corral.cli.sbatch_output import check_output_paths
from corral.cli.sbatch_script import check_script
from corral.schemas.events import JobSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("data", "offset"),
    [(b"#!/bin/sh\necho a\x00b\n", 16), (b"#!/bin/sh\n\x00", 10), (b"#!/bin/sh\n#SBATCH -J \x00\n", 21)],
    ids=["in-a-command", "alone", "in-a-directive"],
)
def test_a_script_with_a_nul_byte_is_refused_naming_the_byte(data: bytes, offset: int) -> None:
    with pytest.raises(CliError) as refused:
        check_script(data)
    assert refused.value.message == (
        f"batch script contains a NUL byte (byte {offset}): a batch script must be text; "
        "remove the \\0 characters"
    )


def spec_of(argv: list[str], cwd: str) -> JobSpec:
    """The job sbatch makes of ``argv`` and a one-line script, submitted from ``cwd``."""
    invocation = parse_command_line(argv)
    return build_submission(invocation, b"#!/bin/sh\ntrue\n", environ={}, cwd=cwd, hostname="login1").spec


def output_error(argv: list[str], cwd: Path, writable: Callable[[str], bool] | None = None) -> str | None:
    """sbatch's refusal of the job's output paths (None: accepted)."""
    try:
        if writable is None:
            check_output_paths(spec_of(argv, str(cwd)))
        else:
            check_output_paths(spec_of(argv, str(cwd)), writable=writable)
    except CliError as exc:
        return exc.message
    return None


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """A submit directory holding a plain file ``afile`` and a directory ``logs``."""
    (tmp_path / "afile").write_text("")
    (tmp_path / "logs").mkdir()
    return tmp_path


ACCEPTED = {
    "default-in-cwd": [],
    "existing-dir": ["-o", "logs/%j.out"],
    "missing-dirs-are-created": ["-o", "logs/new/deeper/%j.out", "-e", "new/%j.err"],
    "pattern-in-a-directory": ["-o", "logs/%u/%j/out.txt"],
    "absolute": ["-e", "/tmp/%j.err"],
}


@pytest.mark.parametrize("argv", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_an_output_directory_the_user_can_write_or_create_is_accepted(cwd: Path, argv: list[str]) -> None:
    assert output_error([*argv, "s.sh"], cwd) is None


def test_an_output_path_under_a_file_is_refused_naming_it(cwd: Path) -> None:
    assert output_error(["-o", "afile/%j.out", "s.sh"], cwd) == (
        f"--output=afile/%j.out: {cwd}/afile is not a directory; give a file in a directory you can write"
    )
    assert output_error(["-e", "afile/x/%j.err", "s.sh"], cwd) == (
        f"--error=afile/x/%j.err: {cwd}/afile is not a directory; give a file in a directory you can write"
    )


def test_a_directory_the_user_cannot_write_is_refused(cwd: Path) -> None:
    # The test runs as root, who may write anywhere: the permission check is given (os.access otherwise).
    def writable(path: str) -> bool:
        return path != str(cwd / "logs")

    assert output_error(["-o", "logs/%j.out", "s.sh"], cwd, writable) == (
        f"--output=logs/%j.out: you cannot write to {cwd}/logs; give a file in a directory you can write"
    )
    # A directory to create needs its nearest existing parent writable.
    assert output_error(["-o", "logs/new/%j/x.out", "s.sh"], cwd, writable) == (
        f"--output=logs/new/%j/x.out: you cannot create {cwd}/logs/new (no write permission on {cwd}/logs); "
        "give a file in a directory you can write"
    )
    # The default output file goes in the submit directory.
    assert output_error(["-D", "logs", "s.sh"], cwd, writable) == (
        f"the default output file slurm-%j.out: you cannot write to {cwd}/logs; "
        "give -o a file in a directory you can write, or -D a directory you can write"
    )
