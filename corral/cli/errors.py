"""How the Slurm-style commands fail: one line on stderr, ``<cmd>: error: <message>``, exit status 1.

sbatch, srun and salloc print Slurm's own line and exit status first for the option and submission errors
Slurm reports (``slurm_refusals``: ``Invalid --time specification``, exit 255), then Corral's line.

Hierarchy::

    CliError        anything a command reports to its user: bad option, unreachable cluster, rejected request

``run_command`` is the one place that turns exceptions into that line: a ``CliError`` or a Slurm-format
``FormatError`` prints its message, anything unexpected prints its type and message (never a traceback,
which scripts calling these commands would mistake for output), Ctrl-C exits 130 and a closed stdout pipe
(``squeue | head -1``) exits quietly.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from corral.libs.slurm.errors import FormatError

#: Exit status of every failure, as in Slurm.
EXIT_FAILURE = 1
#: Commands whose option and submission errors print Slurm's line and exit status first (slurm_refusals).
SLURM_FORM = frozenset({"sbatch", "srun", "salloc"})
#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


class CliError(Exception):
    """A failure to report to the user as ``<cmd>: error: <message>``; ``message`` is one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        # The line printed after "<cmd>: error: ".
        self.message = message


def error_line(command: str, message: str) -> str:
    """The line a command prints for a failure, as Slurm's commands do."""
    return f"{command}: error: {message}"


def warn(command: str, message: str) -> None:
    """Print a warning line as Slurm does (``sbatch: warning: ...``) on stderr."""
    print(f"{command}: warning: {message}", file=sys.stderr)


def run_command(command: str, body: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Run ``body(argv)`` and return its exit status, turning every exception into one stderr line."""
    args = sys.argv[1:] if argv is None else argv
    try:
        status = body(args)
        sys.stdout.flush()
        return status
    except CliError as exc:
        message = exc.message
    except FormatError as exc:
        message = str(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (squeue | head): stop writing, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as exc:
        message = f"internal error ({type(exc).__name__}: {exc}); please report this"
    if command in SLURM_FORM:
        from corral.cli.slurm_refusals import refusal

        slurm = refusal(command, message)
        if slurm is not None:
            for line in slurm.slurm:
                print(line, file=sys.stderr)
            if slurm.hint is not None:
                print(error_line(command, slurm.hint), file=sys.stderr)
            return slurm.status
    print(error_line(command, message), file=sys.stderr)
    return EXIT_FAILURE
