"""The batch script sbatch submits: Slurm's checks of a script file, ``--wrap``'s script, and where the
``#SBATCH`` directives are (the lines after the shebang up to the first command; blank lines and comments
may come between; ``#`` after a space starts a comment). Pure.
"""

from __future__ import annotations

from corral.cli.errors import CliError

#: Largest batch script accepted, in bytes (Slurm's default max_script_size).
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
#: Slurm's refusal of a file that has no shebang, in its words.
NOT_A_SCRIPT = (
    "This does not look like a batch script.  "
    "The first line must start with #! followed by the path to an interpreter."
)


def directive_lines(script: str) -> list[tuple[int, str]]:
    """The ``#SBATCH`` lines of a script as (line number, text after ``#SBATCH``)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(script.split("\n")[1:], start=2):
        if line.startswith("#SBATCH") and (len(line) == 7 or line[7].isspace()):
            found.append((number, line[7:]))
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return found


def strip_comment(text: str) -> str:
    """Cut a ``#`` comment that starts a word outside quotes, as a shell would."""
    quote = ""
    escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1].isspace()):
            return text[:index]
    return text


def check_script(data: bytes) -> str:
    """The script's text, after Slurm's checks (size, shebang, line breaks) and Corral's (no NUL byte)."""
    if len(data) > MAX_SCRIPT_BYTES:
        raise CliError(f"batch script is {len(data)} bytes, more than the limit of {MAX_SCRIPT_BYTES}")
    nul = data.find(b"\0")
    if nul >= 0:
        # A shell drops it or stops reading there (and the gateway refuses it): say so now, naming the byte.
        raise CliError(
            f"batch script contains a NUL byte (byte {nul}): a batch script must be text; "
            "remove the \\0 characters"
        )
    try:
        script = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"batch script is not UTF-8 text (byte {exc.start})") from None
    if not script:
        raise CliError("Batch script is empty!")
    if not script.strip():
        raise CliError("Batch script contains only whitespace!")
    if not script.startswith("#!"):
        raise CliError(NOT_A_SCRIPT)
    if "\r\n" in script:
        raise CliError(
            "Batch script contains DOS line breaks (\\r\\n) instead of expected UNIX line breaks (\\n)."
        )
    return script


def wrap_script(command: str) -> str:
    """The script sbatch writes for ``--wrap``."""
    return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"
