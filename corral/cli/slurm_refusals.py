"""How sbatch, srun and salloc refuse bad options: Slurm 22.05's first line and exit status, then the hint.

Scripts and wrappers grep the first line Slurm prints and test its exit status, so for the errors Slurm
itself detects these commands print Slurm's line first (its exact text) and then, on a line of its own,
Corral's ``<cmd>: error: invalid --X "VALUE": <the fix>`` (which names the field and says how to write
it). Where Slurm's line says everything (getopt's ``unrecognized option``), Slurm's two lines stand alone.
The kinds, as Slurm 22.05 reports them (src/common/slurm_opt.c, proc_args.c, src/sbatch/sbatch.c):

- getopt's own errors (unknown option, missing or unwanted argument): ``sbatch: unrecognized option
  '--bogus'`` (no ``error:``) and ``Try "sbatch --help" for more information``; exit 255.
- a value Slurm parses on the client: ``sbatch: error: Invalid --time specification`` (``--mem``,
  ``--begin``, ``--signal`` ... alike), ``"x" is not a valid node count`` for ``-N``; exit 255. A count
  (``-n``, ``-c`` ...) is parse_int's ``Invalid numeric value "x" for --ntasks.``, which exits 1.
- a value only the controller checks (``--gres``, ``-p``, ``-A``, ``--qos``, ``-C``), whether Corral
  refuses it before sending or the gateway does: ``sbatch: error: Batch job submission failed: Invalid
  generic resource (gres) specification`` (srun: ``Unable to allocate resources:``, salloc: ``Job
  submit/allocate failed:``); exit 1.

Everything else keeps Corral's one line and exit 1. Pure: ``refusal`` maps a message to what to print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Exit status of Slurm's option errors (``exit(-1)``).
EXIT_OPTION = 255
#: Exit status of a refused submission and of a bad count (Slurm's error_exit and parse_int's exit(1)).
EXIT_REFUSED = 1

#: Options whose bad value Slurm reports as ``Invalid --X specification``.
SPECIFICATION = frozenset(
    {"--time", "--time-min", "--begin", "--deadline", "--mem", "--mem-per-cpu", "--mem-per-gpu",
     "--open-mode", "--signal", "--exclusive", "--mail-type", "--delay-boot", "--distribution",
     "--gres-flags", "--kill-on-invalid-dep", "--wait-all-nodes"}
)  # fmt: skip
#: Options Slurm reads with parse_int: ``Invalid numeric value "x" for --X.``, exit 1.
NUMERIC = frozenset(
    {"--ntasks", "--cpus-per-task", "--ntasks-per-node", "--cpus-per-gpu", "--ntasks-per-core",
     "--ntasks-per-socket", "--ntasks-per-gpu", "--cores-per-socket", "--mincpus"}
)  # fmt: skip
#: Options only slurmctld checks, with its error text (slurm_strerror).
CONTROLLER = {
    "--gres": "Invalid generic resource (gres) specification",
    "--gpus": "Invalid generic resource (gres) specification",
    "--gpus-per-node": "Invalid generic resource (gres) specification",
    "--gpus-per-task": "Invalid generic resource (gres) specification",
    "--partition": "Invalid partition name specified",
    "--account": "Invalid account or account/partition combination specified",
    "--qos": "Invalid qos specification",
    "--constraint": "Invalid feature specification",
}
#: What each command says before slurmctld's error text when it refuses a job.
SUBMIT_FAILED = {
    "sbatch": "Batch job submission failed",
    "srun": "Unable to allocate resources",
    "salloc": "Job submit/allocate failed",
}
#: slurmctld's error texts a gateway refusal may begin with (``<text>: <Corral's reason>``).
CONTROLLER_TEXTS = (*dict.fromkeys(CONTROLLER.values()), "Invalid node name specified")

_GETOPT = re.compile(
    r"(unrecognized option '[^']*'|invalid option -- '.'|option requires an argument -- '.'"
    r"|option '[^']*' requires an argument|option '[^']*' doesn't allow an argument"
    r"|option '[^']*' is ambiguous[^(]*?)( \(#SBATCH line \d+\))?$"
)
_INVALID = re.compile(r'invalid (--[a-z][a-z-]*) "(.*?)": ')
_SUBMIT = re.compile(
    r"(Batch job submission failed|Unable to allocate resources|Job submit/allocate failed): (.*)"
)


@dataclass(frozen=True)
class Refusal:
    """What a command prints for an error: Slurm's lines (verbatim), then Corral's hint line if any."""

    slurm: tuple[str, ...]  # Slurm's lines, printed first as they are
    hint: str | None  # Corral's message (printed as ``<cmd>: error: <hint>``); None when Slurm's say it
    status: int  # exit status


def refusal(command: str, message: str) -> Refusal | None:
    """Slurm's form of an option or submission error of ``command``; None to keep Corral's line."""
    if command not in SUBMIT_FAILED:
        return None
    getopt = _GETOPT.fullmatch(message)
    if getopt:
        lines = (f"{command}: {getopt.group(1)}", f'Try "{command} --help" for more information')
        return Refusal(lines, message if getopt.group(2) else None, EXIT_OPTION)
    submit = _SUBMIT.fullmatch(message)
    if submit:
        # srun and salloc submit through sbatch's call: their own words for it; --test-only's stay.
        said = submit.group(1)
        return _controller(
            command, SUBMIT_FAILED[command] if said == SUBMIT_FAILED["sbatch"] else said, submit.group(2)
        )
    invalid = _INVALID.match(message)
    if invalid is None:
        return None
    option, value = invalid.groups()
    if option in SPECIFICATION:
        return Refusal((f"{command}: error: Invalid {option} specification",), message, EXIT_OPTION)
    if option == "--nodes" and not value.isdigit():  # Slurm takes -N 0 and the controller refuses it
        return Refusal((f'{command}: error: "{value}" is not a valid node count',), message, EXIT_OPTION)
    if option in NUMERIC:
        line = f'{command}: error: Invalid numeric value "{value}" for {option}.'
        return Refusal((line,), message, EXIT_REFUSED)
    if option in CONTROLLER:
        line = f"{command}: error: {SUBMIT_FAILED[command]}: {CONTROLLER[option]}"
        return Refusal((line,), message, EXIT_REFUSED)
    return None


def _controller(command: str, failed: str, reason: str) -> Refusal:
    """A refused submission: Slurm's line with slurmctld's text alone, Corral's reason after it."""
    for text in CONTROLLER_TEXTS:
        if reason.startswith(text + ": "):
            line = f"{command}: error: {failed}: {text}"
            return Refusal((line,), reason[len(text) + 2 :], EXIT_REFUSED)
    return Refusal((f"{command}: error: {failed}: {reason}",), None, EXIT_REFUSED)
