"""The batch script sbatch submits: Slurm's checks of a script file, ``--wrap``'s script, where the
``#SBATCH`` directives are (the lines after the shebang up to the first command; blank lines and comments
may come between; each at most MAX_DIRECTIVE_CHARS long) and their words (shell-quoted; a ``#`` that starts
a word starts a comment). Pure.
"""

from __future__ import annotations

import re

from corral.cli.errors import CliError

#: Largest batch script accepted, in bytes (Slurm's default max_script_size).
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
#: Longest ``#SBATCH`` line read, in characters: far more than any real one, and a bound on the work.
MAX_DIRECTIVE_CHARS = 64 * 1024
#: Slurm's refusal of a file that has no shebang, in its words.
NOT_A_SCRIPT = (
    "This does not look like a batch script.  "
    "The first line must start with #! followed by the path to an interpreter."
)


def directive_lines(script: str) -> list[tuple[int, str]]:
    """The ``#SBATCH`` lines of a script as (line number, text after ``#SBATCH``); CliError for a line
    longer than MAX_DIRECTIVE_CHARS, before anything reads it."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(script.split("\n")[1:], start=2):
        if line.startswith("#SBATCH") and (len(line) == 7 or line[7].isspace()):
            if len(line) > MAX_DIRECTIVE_CHARS:
                raise CliError(
                    f"#SBATCH line {number} is {len(line)} characters long, more than the limit of "
                    f"{MAX_DIRECTIVE_CHARS}: split its options over several #SBATCH lines"
                )
            found.append((number, line[7:]))
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return found


#: Characters between words (shlex's POSIX whitespace).
_BLANKS = " \t\r\n"
_BLANK_RUN = re.compile(r"[ \t\r\n]+")
#: A ``#`` that starts a word, in a text without quotes or backslashes.
_COMMENT = re.compile(r"(?:^|(?<=[ \t\r\n]))#")
#: Unquoted characters of a word, a backslash escaping the next one (the loop unrolled: no backtracking).
_BARE = re.compile(r"[^ \t\r\n'\"\\]*(?:\\.[^ \t\r\n'\"\\]*)*", re.S)
_SINGLE = re.compile(r"'[^']*'")
#: A double-quoted part: a backslash escapes the next character (it is kept unless that is \ or ").
_DOUBLE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_DOUBLE_OPEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*', re.S)
#: What a backslash escapes, split out: joining the pieces drops the backslashes (faster than ``sub``).
_ESCAPED = re.compile(r"\\(.)", re.S)
_DOUBLE_ESCAPED = re.compile(r'\\([\\"])')


def directive_words(text: str) -> list[str]:
    """The words of an ``#SBATCH`` line's text as a POSIX shell reads them (shlex's POSIX mode): quotes and
    backslashes unquoted, and a ``#`` that starts a word begins a comment.

    Linear in the text: each part of a word is one regular-expression match, and a line without quotes or
    backslashes is one split (shlex adds a word's characters one at a time, which is quadratic in its
    length). ValueError, with shlex's words, for an unclosed quote or a backslash at the end.
    """
    if not any(char in text for char in "'\"\\"):
        comment = _COMMENT.search(text)
        head = text[: comment.start() if comment else len(text)].strip(_BLANKS)
        return _BLANK_RUN.split(head) if head else []
    return _quoted_words(text)


def _quoted_words(text: str) -> list[str]:
    """``directive_words`` of a text with quotes or backslashes."""
    words: list[str] = []
    parts: list[str] | None = None  # the word being read, None between words
    pos, end = 0, len(text)
    while pos < end:
        char = text[pos]
        if char in _BLANKS:
            if parts is not None:
                words.append("".join(parts))
                parts = None
            pos = _match(_BLANK_RUN, text, pos).end()
            continue
        if char == "#" and parts is None:
            break
        if parts is None:
            parts = []
        if char == "'":
            part = _SINGLE.match(text, pos)
            if part is None:
                raise ValueError("No closing quotation")
            parts.append(part.group()[1:-1])
        elif char == '"':
            part = _DOUBLE.match(text, pos)
            if part is None:
                opened = _match(_DOUBLE_OPEN, text, pos).end()
                raise ValueError("No escaped character" if opened < end else "No closing quotation")
            parts.extend(_DOUBLE_ESCAPED.split(part.group()[1:-1]))
        else:
            part = _match(_BARE, text, pos)
            if part.end() == pos:  # a backslash that ends the text
                raise ValueError("No escaped character")
            parts.extend(_ESCAPED.split(part.group()))
        pos = part.end()
    if parts is not None:
        words.append("".join(parts))
    return words


def _match(pattern: re.Pattern[str], text: str, pos: int) -> re.Match[str]:
    """``pattern`` at ``pos``, which the caller knows it matches."""
    found = pattern.match(text, pos)
    assert found is not None
    return found


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
