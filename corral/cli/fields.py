"""Output fields shared by squeue, sacct and sinfo: ``%``-format specifications, cells, state names.

A ``%``-format (``squeue -o``, ``sinfo -o``) is literal text with fields ``%[.|-][#|width]letter``: ``.``
right-justifies, ``-`` (or nothing) left-justifies, a width pads *and truncates* the value to exactly that
many characters as Slurm does, no width prints the value as is, ``#`` (sinfo) sizes the column to its
longest value. Text after a field's letter is printed after it; ``%%`` is a literal ``%``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import msgspec

from corral.cli.errors import CliError

#: Slurm's compact job state codes (squeue ``%t``), by long name.
STATE_CODES: dict[str, str] = {
    "PENDING": "PD",
    "RUNNING": "R",
    "SUSPENDED": "S",
    "COMPLETING": "CG",
    "COMPLETED": "CD",
    "CONFIGURING": "CF",
    "CANCELLED": "CA",
    "FAILED": "F",
    "TIMEOUT": "TO",
    "PREEMPTED": "PR",
    "NODE_FAIL": "NF",
    "BOOT_FAIL": "BF",
    "DEADLINE": "DL",
    "OUT_OF_MEMORY": "OOM",
    "REQUEUED": "RQ",
    "REQUEUE_HOLD": "RH",
    "REQUEUE_FED": "RF",
    "RESIZING": "RS",
    "REVOKED": "RV",
    "SIGNALING": "SI",
    "SPECIAL_EXIT": "SE",
    "STAGE_OUT": "SO",
    "STOPPED": "ST",
}
_STATE_BY_CODE = {code: name for name, code in STATE_CODES.items()}

_FORMAT_FIELD = re.compile(r"%(?P<align>[.\-]?)(?P<width>#|[0-9]*)(?P<letter>[A-Za-z])")


class FieldSpec(msgspec.Struct, frozen=True):
    """One field of an output format."""

    key: str  # the field's letter (``%i``) or name (``JobID``)
    width: int | None = None  # exact column width; None prints the value as is
    right: bool = False  # right-justify instead of left
    auto: bool = False  # size the column to its longest value (``%#N``)
    suffix: str = ""  # literal text printed after the field


class Layout(msgspec.Struct, frozen=True):
    """A parsed output format: leading literal text, then fields each followed by their own text."""

    prefix: str  # text before the first field
    fields: tuple[FieldSpec, ...]  # the fields, in order


def state_code(state: str) -> str:
    """The compact code of a job state (``PENDING`` is ``PD``); an unknown state prints as it is."""
    return STATE_CODES.get(state.upper(), state)


def parse_states(items: Iterable[str], option: str) -> list[str]:
    """Long job state names from codes or names in any case (``pd,Running`` is PENDING, RUNNING).

    ``all`` is not handled here: callers decide what it means for them.
    """
    states: list[str] = []
    for item in items:
        text = item.strip().upper()
        name = _STATE_BY_CODE.get(text, text if text in STATE_CODES else None)
        if name is None:
            raise CliError(
                f'invalid {option} "{item}": use job states like PENDING,RUNNING or codes like PD,R'
            )
        if name not in states:
            states.append(name)
    return states


def parse_layout(text: str, option: str, letters: Iterable[str], later: Iterable[str] = ()) -> Layout:
    """Parse a ``%``-format; CliError naming ``option`` for an unknown or not yet supported letter."""
    known = set(letters)
    not_yet = set(later)
    text = text.replace("%%", "\0")
    fields: list[FieldSpec] = []
    matches = list(_FORMAT_FIELD.finditer(text))
    stray = text[: matches[0].start()] if matches else text
    if "%" in stray:
        raise CliError(f'invalid {option} "{text}": a "%" must be followed by a field letter')
    for index, match in enumerate(matches):
        letter = match["letter"]
        if letter in not_yet:
            raise CliError(f"{option} field %{letter} is not supported by Corral yet")
        if letter not in known:
            raise CliError(f"invalid {option} field %{letter}: use one of %{' %'.join(sorted(known))}")
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        suffix = text[match.end() : end]
        if "%" in suffix:
            raise CliError(f'invalid {option} "{text}": a "%" must be followed by a field letter')
        width_text = match["width"]
        fields.append(
            FieldSpec(
                key=letter,
                width=int(width_text) if width_text.isdigit() else None,
                right=match["align"] == ".",
                auto=width_text == "#",
                suffix=suffix.replace("\0", "%"),
            )
        )
    return Layout(stray.replace("\0", "%"), tuple(fields))


def fit(value: str, width: int | None, right: bool) -> str:
    """Pad or truncate ``value`` to exactly ``width`` characters (squeue and sinfo keep the left part)."""
    if width is None:
        return value
    value = value[:width]
    return value.rjust(width) if right else value.ljust(width)


def render_layout(
    layout: Layout, titles: Sequence[str], rows: Sequence[Sequence[str]], *, header: bool = True
) -> list[str]:
    """Lines of a ``%``-format table: the titles (if ``header``) then one line per row of field values.

    An auto-sized column (``%#N``) fits its longest value and its title, header shown or not, so that
    ``-h`` output lines up as the full output does.
    """
    widths: list[int | None] = []
    for index, spec in enumerate(layout.fields):
        if spec.auto:
            column = [row[index] for row in rows] + [titles[index]]
            widths.append(max(len(value) for value in column))
        else:
            widths.append(spec.width)
    lines = [titles] if header else []
    lines += list(rows)
    return [
        layout.prefix
        + "".join(
            fit(value, width, spec.right) + spec.suffix
            for value, width, spec in zip(line, widths, layout.fields, strict=True)
        )
        for line in lines
    ]
