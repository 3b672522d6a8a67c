"""sbatch's refusals of input that used to be accepted and then fail the job: a NUL byte in the script, an
output directory the user cannot write; and the bound on an ``#SBATCH`` line."""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.cli.errors import CliError
from corral.cli.sbatch_args import build_submission, directive_options, parse_command_line
from corral.cli.sbatch_output import check_output_paths
from corral.cli.sbatch_script import MAX_DIRECTIVE_CHARS, check_script, directive_words
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


def test_an_output_path_that_is_a_directory_is_refused(cwd: Path) -> None:
    assert output_error(["-o", "logs", "s.sh"], cwd) == (
        f"--output=logs: {cwd}/logs is a directory; give a file in a directory you can write"
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
    # A file that is already there needs only to be writable itself (-o /dev/null, in /dev).
    assert output_error(["-o", "/dev/null", "s.sh"], cwd, lambda path: path == "/dev/null") is None
    assert output_error(["-e", "afile", "s.sh"], cwd, writable) is None
    assert output_error(["-e", "afile", "s.sh"], cwd, lambda path: path != str(cwd / "afile")) == (
        f"--error=afile: you cannot write to {cwd}/afile; give a file in a directory you can write"
    )
    # The default output file goes in the submit directory.
    assert output_error(["-D", "logs", "s.sh"], cwd, writable) == (
        f"the default output file slurm-%j.out: you cannot write to {cwd}/logs; "
        "give -o a file in a directory you can write, or -D a directory you can write"
    )


# The quadratic parser took 7.7 s (24 s on a loaded 2-core VM) of CPU for one 1 MiB #SBATCH line; the
# linear one takes milliseconds. The bounds below are generous on purpose: they fail only for the old cost.
CPU_BUDGET_S = 1.0


def cpu_seconds(call: Callable[[], object]) -> float:
    """The CPU time ``call`` takes (not wall time: a loaded machine does not change it much)."""
    started = time.process_time()
    with contextlib.suppress(CliError):
        call()
    return time.process_time() - started


def test_an_over_long_directive_line_is_refused_before_it_is_parsed() -> None:
    line = "#SBATCH -J " + "a" * (1024 * 1024)
    script = f"#!/bin/sh\n#SBATCH -N 1\n{line}\ntrue\n"
    with pytest.raises(CliError) as refused:
        directive_options(script)
    assert refused.value.message == (
        f"#SBATCH line 3 is {len(line)} characters long, more than the limit of {MAX_DIRECTIVE_CHARS}: "
        "split its options over several #SBATCH lines"
    )
    assert cpu_seconds(lambda: directive_options(script)) < CPU_BUDGET_S
    # The longest line allowed is parsed.
    assert directive_options(f"#!/bin/sh\n#SBATCH -J {'a' * (MAX_DIRECTIVE_CHARS - 11)}\n").last("job-name")


@pytest.mark.parametrize(
    "text",
    [
        " -J " + "a" * (1 << 20),
        ' -J "' + "a" * (1 << 20) + '"',
        " -J a" * (MAX_DIRECTIVE_CHARS // 5 * 4),
        " 'a'" * (MAX_DIRECTIVE_CHARS // 4 * 4),
        " " + "\\a" * (1 << 19),
    ],
    ids=["one-word", "one-quoted-word", "many-words", "many-quoted-words", "escapes"],
)
def test_splitting_a_directive_is_linear(text: str) -> None:
    # Words of 1 MiB (16 times the longest line allowed), or four lines' worth of short words.
    assert cpu_seconds(lambda: directive_words(text)) < CPU_BUDGET_S


# Shell words without comments: the splitter agrees with shlex's POSIX mode (which is quadratic in the
# length of a word, so it is the reference here for short texts only).
shell_text = st.text(alphabet=st.sampled_from(list(" \t\"'\\abc=-\x0b\xa0é")), max_size=40)


@settings(max_examples=300, deadline=None)
@given(shell_text)
def test_splitting_agrees_with_posix_shlex(text: str) -> None:
    try:
        expected: list[str] | str = shlex.split(text)
    except ValueError as exc:
        expected = str(exc)
    try:
        got: list[str] | str = directive_words(text)
    except ValueError as exc:
        got = str(exc)
    assert got == expected


COMMENTS = {
    "after-a-space": (" -J a # note", ["-J", "a"]),
    "whole-line": ("# -J a", []),
    "inside-a-word": (" --job-name=a#b", ["--job-name=a#b"]),
    "quoted": (" -J 'a # b'", ["-J", "a # b"]),
    "double-quoted": (' -J "a # b"', ["-J", "a # b"]),
    "after-an-escaped-space": (" -J a\\ #b", ["-J", "a #b"]),
    "after-a-quote": (" -J 'a'#b", ["-J", "a#b"]),
    "after-a-tab": (" -J a\t#b", ["-J", "a"]),
    "not-after-another-space": (" -J a\x0b#b", ["-J", "a\x0b#b"]),
}


@pytest.mark.parametrize(("text", "words"), COMMENTS.values(), ids=COMMENTS.keys())
def test_a_comment_starts_a_word_outside_quotes(text: str, words: list[str]) -> None:
    assert directive_words(text) == words
