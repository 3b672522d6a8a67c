"""Slurm signal specifications: ``--signal=[{R|B}:]SIG[@T]`` and ``scancel -s SIG``.

A signal is a number (``10``) or a name with or without the ``SIG`` prefix, in any case (``USR1``,
``SIGUSR1``, ``usr1``). ``@T`` is how many seconds before the time limit to send it, 60 when omitted as in
Slurm. ``B:`` sends it to the batch shell only; ``R:`` (reservation overlap, also as ``RB:``/``BR:``) is
accepted for compatibility and has no effect.
"""

from __future__ import annotations

import re
import signal

import msgspec

from corral.libs.slurm.errors import FormatError

#: The terminating signal of an OOM-killed job as Slurm shows it (``ExitCode 0:125``): its dummy SIG_OOM (253)
#: kept in a wait status's 7 signal bits.
OOM_SIGNAL = 253 & 0x7F


def shown_exit(exit_code: int, signal: int, oom: bool) -> tuple[int, int]:
    """(exit code, signal) as sacct shows them: an OOM kill is Slurm's ``0:125``, whatever the status was."""
    return (0, OOM_SIGNAL) if oom else (exit_code, signal)


# Seconds before the limit when "@T" is omitted, as in Slurm.
DEFAULT_SECONDS_BEFORE = 60
# Slurm stores T in 16 bits.
MAX_SECONDS_BEFORE = 0xFFFF

_NAME_FIX = "use a signal name with or without SIG (USR1, SIGUSR1) or a number (10)"
_OPTION_FIX = "use [{R|B}:]SIG[@SECONDS] (e.g. USR1, SIGUSR1@90, B:TERM@120, 10@30)"
_FLAGS = {"": False, "B": True, "R": False, "BR": True, "RB": True}
_NUMBER = re.compile(r"[0-9]{1,5}")


class SignalSpec(msgspec.Struct, frozen=True):
    """When and to whom to send a warning signal before a job's time limit."""

    # Signal number, e.g. 10 for SIGUSR1 on Linux.
    signum: int
    # Seconds before the time limit to send it.
    seconds_before: int
    # True: only the batch shell gets it; False: every task of every step.
    batch_only: bool


def parse_signal_option(text: str, field: str = "--signal") -> SignalSpec:
    """Return the signal, lead time and target of a ``--signal`` value.

    Raises FormatError for an unknown flag or signal and for a lead time outside 0..65535 seconds.
    """
    value = text.strip()
    flags, _, rest = value.rpartition(":")
    batch_only = _FLAGS.get(flags.upper())
    if batch_only is None:
        raise FormatError(field, text, _OPTION_FIX)
    name, at, seconds_text = rest.partition("@")
    signum = _signal_number(name)
    if signum is None:
        raise FormatError(field, text, _OPTION_FIX)
    if not at:
        return SignalSpec(signum, DEFAULT_SECONDS_BEFORE, batch_only)
    if not _NUMBER.fullmatch(seconds_text) or int(seconds_text) > MAX_SECONDS_BEFORE:
        raise FormatError(field, text, f"give @SECONDS as a whole number from 0 to {MAX_SECONDS_BEFORE}")
    return SignalSpec(signum, int(seconds_text), batch_only)


def parse_signal_name(text: str, field: str = "--signal") -> int:
    """Return the number of a signal given by name (``USR1``, ``SIGUSR1``, any case) or number.

    Raises FormatError for unknown names and for numbers that are not signals on this platform.
    """
    signum = _signal_number(text.strip())
    if signum is None:
        raise FormatError(field, text, _NAME_FIX)
    return signum


def _signal_number(value: str) -> int | None:
    """Return the signal a name or number stands for, or None."""
    if _NUMBER.fullmatch(value):
        return int(value) if int(value) in signal.valid_signals() else None
    # ASCII only: str.upper() maps some other letters to ASCII ones ("ſ" to "S").
    if not (value.isascii() and value.isalnum()):
        return None
    member = signal.Signals.__members__.get("SIG" + value.upper().removeprefix("SIG"))
    return None if member is None else int(member)
