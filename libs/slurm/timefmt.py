"""Slurm durations and timestamps: ``--time`` values, squeue and sacct columns, ``scontrol`` dates.

Time limits are read in the six forms Slurm accepts (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
``D-H:M:S``; a lone number is minutes) and kept as exact seconds: Slurm rounds seconds up to whole minutes,
Corral does not, so short limits in tests mean what they say. ``None`` is "no limit".

Printing follows Slurm's two styles: squeue's short one (``0:03``, ``30:00``, ``1:00:00``,
``1-00:00:00``) and sacct/scontrol's fixed one (``00:00:03``, ``1-02:03:04``).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo

from corral.libs.slurm.errors import FormatError

# Largest limit accepted, in seconds (about 68 years); keeps values in a signed 32-bit field.
MAX_TIME_LIMIT = 2**31 - 1

_FIX = "use M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"
_UNLIMITED = frozenset({"unlimited", "infinite", "-1"})
# Field lengths are capped only so int() stays cheap; the total is checked against MAX_TIME_LIMIT.
_NUMBER = re.compile(r"[0-9]{1,12}")
# Seconds per field, by form: the fields after "D-" are H[:M[:S]], without a day they are M[:S] or H:M:S.
_UNITS_WITH_DAYS = {1: (3600,), 2: (3600, 60), 3: (3600, 60, 1)}
_UNITS_WITHOUT_DAYS = {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}


def parse_time_limit(text: str, field: str = "--time") -> int | None:
    """Return a Slurm time limit in seconds, or None for no limit.

    ``UNLIMITED``, ``infinite`` and ``-1`` (any case) are no limit. So is a limit of zero, because Slurm's
    sbatch/srun turn ``--time=0`` into "no limit"; a caller must never read ``0`` as "kill at once".
    Raises FormatError for anything else that is not one of the six forms.
    """
    value = text.strip()
    if value.lower() in _UNLIMITED:
        return None
    days_text, dash, rest = value.rpartition("-")
    fields = rest.split(":")
    units = (_UNITS_WITH_DAYS if dash else _UNITS_WITHOUT_DAYS).get(len(fields))
    numbers = [days_text] if dash else []
    numbers += fields
    if units is None or not all(_NUMBER.fullmatch(n) for n in numbers):
        raise FormatError(field, text, _FIX)
    seconds = sum(int(n) * unit for n, unit in zip(fields, units, strict=True))
    if dash:
        seconds += int(days_text) * 86400
    if seconds > MAX_TIME_LIMIT:
        raise FormatError(field, text, f"a time limit may be at most {format_time_limit(MAX_TIME_LIMIT)}")
    return seconds or None


def format_time_limit(seconds: int | None) -> str:
    """Print a time limit as squeue's ``%l`` does: ``UNLIMITED``, ``30:00``, ``1:00:00``, ``1-00:00:00``."""
    return "UNLIMITED" if seconds is None else format_elapsed(seconds)


def format_elapsed(seconds: int) -> str:
    """Print a duration as squeue's ``%M``/``%L`` do: ``0:03``, ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``.

    A negative duration (clock skew) prints ``INVALID``, as in Slurm.
    """
    if seconds < 0:
        return "INVALID"
    days, hours, minutes, secs = _split(seconds)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def format_elapsed_sacct(seconds: int) -> str:
    """Print a duration as sacct's Elapsed and scontrol's RunTime do: ``00:00:03``, ``1-02:03:04``.

    A negative duration prints ``INVALID``, as in Slurm.
    """
    if seconds < 0:
        return "INVALID"
    days, hours, minutes, secs = _split(seconds)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def format_timestamp(unix_seconds: float | None, tz: tzinfo | None = None) -> str:
    """Print a point in time as Slurm does, ``2026-11-30T16:36:56``, in local time unless tz is given.

    None and 0 print ``Unknown`` (Slurm's "not set"). Fractions of a second are dropped.
    """
    if not unix_seconds:
        return "Unknown"
    moment = datetime.fromtimestamp(int(unix_seconds), tz)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


_BEGIN_FIX = (
    "use now[+COUNT[seconds|minutes|hours|days|weeks]], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], "
    "today, tomorrow, midnight, noon, elevenses, fika or teatime"
)
_OFFSET = re.compile(r"now(?:([+-])([0-9]{1,9})([a-z]*))?")
_OFFSET_UNITS = {
    **dict.fromkeys(("", "s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "week", "weeks"), 604800),
}
_CLOCK = re.compile(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?\s*(am|pm)?")
#: Slurm's named times of day (hour), each the next such moment.
_NAMED_HOURS = {"midnight": 0, "elevenses": 11, "noon": 12, "fika": 15, "teatime": 16}
_DATES = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")


def parse_begin_time(text: str, now: float, field: str = "--begin", tz: tzinfo | None = None) -> float:
    """A ``--begin`` time as Unix seconds, the way Slurm's ``parse_time`` reads it.

    ``now+60`` (seconds), ``now+1hour``; ``HH:MM[:SS]`` (optionally ``AM``/``PM``), ``midnight``, ``noon``,
    ``elevenses``, ``fika`` and ``teatime`` are the next such moment (tomorrow if it has passed today);
    ``today`` and ``tomorrow`` are their midnights; ``YYYY-MM-DD[THH:MM[:SS]]`` is that moment, in local
    time unless ``tz`` is given. Raises FormatError for anything else.
    """
    value = text.strip().lower()
    offset = _OFFSET.fullmatch(value)
    if offset:
        sign, amount, unit = offset.groups()
        if sign is None:
            return now
        seconds = _OFFSET_UNITS.get(unit)
        if seconds is None:
            raise FormatError(field, text, _BEGIN_FIX)
        return now + int(amount) * seconds * (1 if sign == "+" else -1)
    midnight = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    if value in ("today", "tomorrow"):
        return (midnight + timedelta(days=1 if value == "tomorrow" else 0)).timestamp()
    clock = _CLOCK.fullmatch(value)
    if clock or value in _NAMED_HOURS:
        hour, minute, second = _NAMED_HOURS.get(value, 0), 0, 0
        if clock:
            hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3] or 0)
            if clock[4] and not 1 <= hour <= 12:
                raise FormatError(field, text, _BEGIN_FIX)
            if clock[4]:
                hour = hour % 12 + (12 if clock[4] == "pm" else 0)
        if hour > 23 or minute > 59 or second > 59:
            raise FormatError(field, text, _BEGIN_FIX)
        moment = midnight.replace(hour=hour, minute=minute, second=second)
        if moment.timestamp() <= now:
            moment += timedelta(days=1)
        return moment.timestamp()
    for pattern in _DATES:
        try:
            parsed = datetime.strptime(text.strip(), pattern)
        except ValueError:
            continue
        return (parsed.replace(tzinfo=tz) if tz is not None else parsed).timestamp()
    raise FormatError(field, text, _BEGIN_FIX)


def _split(seconds: int) -> tuple[int, int, int, int]:
    """Split seconds into days, hours, minutes and seconds."""
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return days, hours, minutes, secs
