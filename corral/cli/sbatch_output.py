"""Whether the job's output files can be created where ``-o``/``-e`` put them, checked by sbatch as the user.

sbatch runs as the job's user, so it is where that user's permissions are real; a job whose output file
cannot be opened would otherwise be accepted and fail at launch. The check goes only as far as the pattern
is known at submit time: the directory part of the path up to its first component with a ``%`` pattern
(``logs/%j/out.txt`` checks ``logs``). A directory that does not exist yet is created at launch (as
SLURM_CONTRACT.md asks), so it is the nearest existing directory above it that must be writable; a file
that is already there (``-o /dev/null``) must be writable itself, and a directory is refused.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

from corral.cli.errors import CliError
from corral.schemas.events import JobSpec

#: The output file of a job without ``-o`` (an array task's default has the same directory).
DEFAULT_OUTPUT = "slurm-%j.out"
#: The end of every refusal: what to do instead.
FIX = "give a file in a directory you can write"


def _may_write(path: str) -> bool:
    """Whether this process may write the file ``path``, or create files in it if it is a directory."""
    return os.access(path, os.W_OK | (os.X_OK if os.path.isdir(path) else 0))


def check_output_paths(spec: JobSpec, writable: Callable[[str], bool] = _may_write) -> None:
    """Raise CliError naming the option, the path at fault and the fix if the job's stdout or stderr file
    could not be opened; ``writable`` tells whether a file or a directory may be written (``os.access``)."""
    checks = [
        ("output", spec.stdout, spec.stdout or DEFAULT_OUTPUT),
        ("error", spec.stderr, spec.stderr),
    ]
    for option, given, pattern in checks:
        if pattern is None:
            continue
        problem = _problem(pattern, spec.workdir, writable)
        if problem is None:
            continue
        if given is None:
            raise CliError(
                f"the default output file {pattern}: {problem}; give -o a file in a directory you can write, "
                "or -D a directory you can write"
            )
        raise CliError(f"--{option}={given}: {problem}; {FIX}")


def known_directory(pattern: str, workdir: str) -> str:
    """The directory of an output file pattern as far as submit time knows it: the components before the
    first one holding a ``%`` pattern, relative to ``workdir``."""
    directory = posixpath.dirname(posixpath.join(workdir, pattern))
    parts = directory.split("/")
    literal = next((i for i, part in enumerate(parts) if "%" in part), len(parts))
    return "/".join(parts[:literal]) or "/"


def _problem(pattern: str, workdir: str, writable: Callable[[str], bool]) -> str | None:
    """Why the file of ``pattern`` cannot be opened for writing, None if it can (or may: a ``%`` pattern
    in the file name leaves the file unknown, so only its directory is checked)."""
    path = posixpath.join(workdir, pattern)
    if "%" not in path and os.path.isdir(path):
        return f"{path} is a directory"
    if "%" not in path and os.path.lexists(path):
        # A file that is there (-o /dev/null) is opened, not created: its directory does not matter.
        return None if writable(path) else f"you cannot write to {path}"
    directory = known_directory(pattern, workdir)
    existing, first_missing = directory, directory
    while existing not in ("", "/") and not os.path.lexists(existing):
        existing, first_missing = posixpath.dirname(existing), existing
    if not os.path.isdir(existing or "."):
        return f"{existing} is not a directory"
    if writable(existing or "."):
        return None
    if existing == directory:
        return f"you cannot write to {directory}"
    return f"you cannot create {first_missing} (no write permission on {existing})"
