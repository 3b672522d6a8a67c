"""Slurm memory sizes: ``--mem=8G`` in, ``8G``/``3584M`` out, always counted in megabytes (MiB).

Slurm's unit is the mebibyte: a number without a suffix is megabytes, ``K`` rounds up to whole megabytes,
``G``, ``T`` and ``P`` are powers of 1024. A ``B`` may follow the suffix (``8GB``); case does not matter.
``--mem=0`` is valid and means "all the memory of the node" in Slurm; that is the caller's business.
"""

from __future__ import annotations

import re

from corral.libs.slurm.errors import FormatError

# Largest size accepted, in megabytes (1024 PiB); far above any node, small enough for int64 bytes.
MAX_MEMORY_MB = 2**40

_FIX = "use a whole number with an optional unit K, M, G, T or P (e.g. 500M, 8G, 8GB, 3584MB)"
_SIZE = re.compile(r"([0-9]+)(?:([KMGTP])B?)?", re.IGNORECASE | re.ASCII)
# Megabytes per unit, beyond K which rounds up.
_MEGABYTES = {"M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
_UNITS_BIGGEST_FIRST = ("P", "T", "G")
# Digits in the largest number that could be valid: MAX_MEMORY_MB kilobytes.
_MAX_DIGITS = len(str(MAX_MEMORY_MB * 1024))


def parse_memory(text: str, field: str = "--mem") -> int:
    """Return a Slurm memory size in megabytes: ``8G`` is 8192, ``1024`` is 1024, ``1K`` is 1.

    Raises FormatError for negative, fractional or unknown sizes and for more than MAX_MEMORY_MB.
    """
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise FormatError(field, text, _FIX)
    digits = match.group(1).lstrip("0") or "0"
    unit = (match.group(2) or "M").upper()
    # More digits than any valid size stands for "too large", so int() never sees thousands of digits.
    number = int(digits) if len(digits) <= _MAX_DIGITS else MAX_MEMORY_MB * 1024 + 1
    # Slurm rounds kilobytes up so a request is never smaller than asked.
    megabytes = -(-number // 1024) if unit == "K" else number * _MEGABYTES[unit]
    if megabytes > MAX_MEMORY_MB:
        raise FormatError(field, text, f"a memory size may be at most {format_memory(MAX_MEMORY_MB)}")
    return megabytes


def format_memory(megabytes: int) -> str:
    """Print megabytes as Slurm does: the biggest unit that divides exactly (``8G``, ``3584M``, ``1T``).

    Zero prints ``0``. Raises ValueError for a negative size.
    """
    if megabytes < 0:
        raise ValueError(f"memory size must not be negative, got {megabytes}")
    if megabytes == 0:
        return "0"
    for unit in _UNITS_BIGGEST_FIRST:
        if megabytes % _MEGABYTES[unit] == 0:
            return f"{megabytes // _MEGABYTES[unit]}{unit}"
    return f"{megabytes}M"
