"""Slurm hostlists: ``gpu[001-004,010],login1`` to and from lists of host names.

Expansion follows Slurm:

- Top-level items are separated by commas (or whitespace) outside brackets.
- A bracket holds comma-separated numbers and ``lo-hi`` ranges; every number of a range is zero-padded to
  the width of its low bound as written (``[08-10]`` gives ``08 09 10``, ``[8-10]`` gives ``8 9 10``).
- A name may hold several brackets; they expand as a cartesian product, the first bracket outermost
  (``r[1-2]-g[1-2]`` gives ``r1-g1 r1-g2 r2-g1 r2-g2``). Duplicates are kept, like
  ``scontrol show hostnames``.

Compression gives the canonical form Slurm prints for a node set (``SLURM_JOB_NODELIST``): hosts are
deduplicated, split into a prefix and their trailing digits, grouped by prefix (prefixes in natural order,
``rack2`` before ``rack10``; a name without trailing digits comes first and stays as is) and, within a
prefix, by zero-padding width; consecutive numbers of one width become ``lo-hi`` runs. A number without
leading zeros fits any width up to its length, so ``n9,n10`` is ``n[9-10]``, ``n09,n10`` is ``n[09-10]``
and ``gpu099,gpu100`` is ``gpu[099-100]``; ``n1,n01`` are two runs, ``n[1,01]``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence

import msgspec

from corral.libs.slurm.errors import FormatError

# More names than any cluster has; bounds the memory a hostlist like n[1-999999999] could take.
MAX_HOSTS = 1_000_000
# Longest host name accepted (Linux HOST_NAME_MAX is 64; Slurm node names may be longer, not unbounded).
MAX_NAME_LENGTH = 255

_FIX = 'use host names of letters, digits, ".", "_" and "-", with ranges like gpu[001-004,010]'
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]*")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_SEPARATORS = frozenset(", \t\n")


class _Range(msgspec.Struct, frozen=True):
    """Numbers lo..hi, each printed zero-padded to width."""

    lo: int
    hi: int
    width: int

    def names(self) -> Iterator[str]:
        return (str(n).zfill(self.width) for n in range(self.lo, self.hi + 1))


# One top-level item: literal text and brackets (sequences of ranges), in order.
_Part = str | tuple[_Range, ...]


def expand(hostlist: str, field: str = "hostlist") -> list[str]:
    """Return the host names of a hostlist expression, in order, duplicates kept.

    ``expand("gpu[001-002],login")`` is ``["gpu001", "gpu002", "login"]``; ``expand("")`` is ``[]``.
    Raises FormatError for bad syntax or characters and for more than MAX_HOSTS names.
    """
    return [name for item in _parse(hostlist, field) for name in _names(item)]


def first(hostlist: str, field: str = "hostlist") -> str:
    """Return the first host of a hostlist expression without expanding the rest.

    Raises FormatError when the hostlist is malformed or empty.
    """
    items = _parse(hostlist, field)
    if not items:
        raise FormatError(field, hostlist, "give at least one host name")
    return "".join(part if isinstance(part, str) else _pad(part[0].lo, part[0].width) for part in items[0])


def compress(hosts: Iterable[str], field: str = "hostlist") -> str:
    """Return the canonical hostlist expression of a set of host names (see the module docstring).

    ``compress(["gpu010", "gpu001", "gpu002", "gpu001"])`` is ``"gpu[001-002,010]"``; order and
    duplicates of the input do not matter. Raises FormatError for an invalid host name.
    """
    if isinstance(hosts, str):
        raise TypeError("compress() takes an iterable of host names, not a str; use expand() first")
    singles: set[str] = set()
    numbered: dict[str, set[str]] = {}
    for host in hosts:
        _check_name(host, field)
        digits_at = len(host.rstrip("0123456789"))
        if digits_at == len(host):
            singles.add(host)
        else:
            numbered.setdefault(host[:digits_at], set()).add(host[digits_at:])
    # A name without digits sorts before the numbered names that share its text as prefix, as in Slurm.
    keyed = [((_natural_key(name), name, 0), name) for name in singles]
    keyed += [
        ((_natural_key(prefix), prefix, 1), _bracket(prefix, nums)) for prefix, nums in numbered.items()
    ]
    return ",".join(text for _, text in sorted(keyed))


def _parse(hostlist: str, field: str) -> list[list[_Part]]:
    """Split a hostlist into top-level items and check that it expands to at most MAX_HOSTS names."""
    items: list[list[_Part]] = []
    total = 0
    for token in _tokens(hostlist, field):
        parts: list[_Part] = []
        count = 1
        length = 0
        # re.split with a group alternates literal text (even indexes) and bracket contents (odd).
        for index, piece in enumerate(re.split(r"\[([^\[\]]*)\]", token)):
            if index % 2 == 0:
                if not _NAME_CHARS.fullmatch(piece):
                    raise FormatError(field, hostlist, _FIX)
                if piece:
                    parts.append(piece)
                length += len(piece)
            else:
                ranges = _ranges(piece, hostlist, field)
                parts.append(ranges)
                count *= sum(r.hi - r.lo + 1 for r in ranges)
                length += max(max(r.width, len(str(r.hi))) for r in ranges)
            if count > MAX_HOSTS:
                break
        total += count
        if total > MAX_HOSTS:
            raise FormatError(field, hostlist, f"a hostlist may name at most {MAX_HOSTS:,} hosts")
        if length > MAX_NAME_LENGTH:
            raise FormatError(field, hostlist, f"host names are at most {MAX_NAME_LENGTH} characters")
        items.append(parts)
    return items


def _tokens(hostlist: str, field: str) -> list[str]:
    """Split at separators outside brackets; reject nested or unbalanced brackets."""
    tokens: list[str] = []
    start = 0
    depth = 0
    for index, char in enumerate(hostlist):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char in _SEPARATORS and depth == 0:
            tokens.append(hostlist[start:index])
            start = index + 1
        if depth not in (0, 1):
            raise FormatError(field, hostlist, "brackets may not nest and must be balanced")
    if depth != 0:
        raise FormatError(field, hostlist, "brackets may not nest and must be balanced")
    tokens.append(hostlist[start:])
    # Slurm skips empty items ("a,,b" is "a,b").
    return [token for token in tokens if token]


def _ranges(text: str, hostlist: str, field: str) -> tuple[_Range, ...]:
    """Parse the inside of one bracket: ``001-004,010``."""
    ranges = []
    for item in text.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise FormatError(field, hostlist, "write brackets as [N], [LO-HI] or [LO-HI,N,...] with digits")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        if len(lo_text) > MAX_NAME_LENGTH or len(hi_text) > MAX_NAME_LENGTH:
            raise FormatError(field, hostlist, f"host names are at most {MAX_NAME_LENGTH} characters")
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            raise FormatError(field, hostlist, f"range {item} runs backwards; write the low bound first")
        ranges.append(_Range(lo, hi, len(lo_text)))
    return tuple(ranges)


def _names(item: list[_Part]) -> Iterator[str]:
    """Generate the names of one top-level item, the first bracket varying slowest."""
    choices: list[Iterable[str]] = [
        (part,) if isinstance(part, str) else itertools.chain.from_iterable(r.names() for r in part)
        for part in item
    ]
    return ("".join(combo) for combo in itertools.product(*choices))


def _bracket(prefix: str, numbers: set[str]) -> str:
    """Format the trailing numbers of one prefix as runs, ``prefix[1-3,5]`` or ``prefix7``."""
    # Zero-padded numbers fix their width; an unpadded number joins the widest padded width that fits it
    # (its digits then print unchanged), or else the unpadded class 0, where every number prints as is.
    padded_widths = {len(n) for n in numbers if n[0] == "0" and len(n) > 1}
    unpadded_width = {
        length: max((w for w in padded_widths if w <= length), default=0)
        for length in {len(n) for n in numbers}
    }
    classes: dict[int, list[int]] = {}
    for text in numbers:
        padded = text[0] == "0" and len(text) > 1
        classes.setdefault(len(text) if padded else unpadded_width[len(text)], []).append(int(text))
    runs: list[str] = []
    for width in sorted(classes):
        runs.extend(_runs(sorted(classes[width]), width))
    if len(runs) == 1 and "-" not in runs[0]:
        return prefix + runs[0]
    return f"{prefix}[{','.join(runs)}]"


def _runs(values: Sequence[int], width: int) -> Iterator[str]:
    """Yield ``lo-hi`` (or ``n``) for each run of consecutive values."""
    start = 0
    for index in range(1, len(values) + 1):
        if index == len(values) or values[index] != values[index - 1] + 1:
            lo, hi = values[start], values[index - 1]
            yield _pad(lo, width) if lo == hi else f"{_pad(lo, width)}-{_pad(hi, width)}"
            start = index


def _pad(number: int, width: int) -> str:
    return str(number).zfill(width)


def _check_name(host: str, field: str) -> None:
    if not host or not _NAME_CHARS.fullmatch(host):
        raise FormatError(field, host, _FIX)
    if len(host) > MAX_NAME_LENGTH:
        raise FormatError(field, host, f"host names are at most {MAX_NAME_LENGTH} characters")


def _natural_key(text: str) -> list[str | int]:
    """Order text with digit runs compared as numbers: ``rack2`` before ``rack10``."""
    # re.split with a group puts text at even indexes and digit runs at odd ones, so types line up.
    return [int(piece) if index % 2 else piece for index, piece in enumerate(re.split(r"([0-9]+)", text))]
