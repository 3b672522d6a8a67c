"""Slurm generic resources: ``--gres=gpu:h100:4,nic:1``, ``--gpus=h100:4`` and sinfo's ``%G``.

A GRES request is ``name[:type][:count]``: ``gpu`` is one GPU of any type, ``gpu:2`` two, ``gpu:h100``
one H100, ``gpu:h100:4`` four. As in Slurm, a second field that starts with a digit is the count, so a type
that starts with a digit needs an explicit count (``gpu:2080ti:1``). ``gpu:0`` is valid and asks for none,
as in Slurm; so does ``none``. The ``--gpus*`` options take ``[type:]count``, without the resource name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from corral.libs.slurm.errors import FormatError

# Largest count accepted in one request; far above any node, bounded so a typo cannot overflow a field.
MAX_COUNT = 1_000_000

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_DIGITS = re.compile(r"[0-9]+")
_GRES_FIX = "use NAME[:TYPE][:COUNT][,...] (e.g. gpu, gpu:2, gpu:h100:4, gpu:2,nic:1)"
_GPUS_FIX = "use [TYPE:]COUNT with one type (e.g. 4 or h100:4)"


class GresRequest(msgspec.Struct, frozen=True):
    """One requested generic resource, e.g. four H100 GPUs."""

    # Resource name as configured on nodes, e.g. "gpu".
    name: str
    # Model the resource must be, e.g. "h100"; None accepts any.
    type: str | None
    # How many per node; 0 asks for none.
    count: int


def parse_gres(text: str, field: str = "--gres") -> list[GresRequest]:
    """Return the requests of a GRES list in order; ``none`` is the empty list.

    Raises FormatError for empty or malformed items, counts that are not whole numbers in
    0..MAX_COUNT, and a name:type given twice.
    """
    value = text.strip()
    if value.lower() == "none":
        return []
    requests: list[GresRequest] = []
    for item in value.split(","):
        request = _parse_item(item, text, field)
        if any((r.name, r.type) == (request.name, request.type) for r in requests):
            raise FormatError(field, text, f"list {_label(request)} only once, with the total count")
        requests.append(request)
    return requests


def format_gres(requests: Sequence[GresRequest]) -> str:
    """Print GRES requests as ``--gres`` takes them: ``gpu:h100:4,nic:1``; no requests print ``none``."""
    if not requests:
        return "none"
    return ",".join(f"{_label(r)}:{r.count}" for r in requests)


def parse_gpus_spec(text: str, field: str = "--gpus") -> tuple[str | None, int]:
    """Return (type or None, count) of a ``--gpus``/``--gpus-per-node``/``--gpus-per-task`` value.

    ``4`` is ``(None, 4)``, ``h100:4`` is ``("h100", 4)``.

    Raises FormatError for a missing or malformed count, an empty type, or several types in a list.
    """
    type_text, colon, count_text = text.strip().rpartition(":")
    if colon and not _TYPE.fullmatch(type_text):
        raise FormatError(field, text, _GPUS_FIX)
    return (type_text if colon else None, _count(count_text, text, field, _GPUS_FIX))


def format_node_gres(gpu_type: str | None, count: int, name: str = "gpu") -> str:
    """Print a node's configured GRES as sinfo's ``%G`` does: ``gpu:h100:8``, ``gpu:8``, or ``(null)``."""
    if count <= 0:
        return "(null)"
    return f"{name}:{gpu_type}:{count}" if gpu_type else f"{name}:{count}"


def _parse_item(item: str, text: str, field: str) -> GresRequest:
    """Parse one ``name[:type][:count]`` item of a GRES list."""
    name, *rest = item.split(":")
    if not _NAME.fullmatch(name) or len(rest) > 2:
        raise FormatError(field, text, _GRES_FIX)
    if not rest:
        return GresRequest(name, None, 1)
    if len(rest) == 1 and not rest[0][:1].isdigit():
        # As in Slurm, a second field that does not start with a digit is a type; the count is then one.
        rest.append("1")
    if len(rest) == 1:
        return GresRequest(name, None, _count(rest[0], text, field, _GRES_FIX))
    gres_type, count_text = rest
    if not _TYPE.fullmatch(gres_type):
        raise FormatError(field, text, _GRES_FIX)
    return GresRequest(name, gres_type, _count(count_text, text, field, _GRES_FIX))


def _count(count_text: str, text: str, field: str, fix: str) -> int:
    """Parse a count of 0..MAX_COUNT."""
    if not _DIGITS.fullmatch(count_text):
        raise FormatError(field, text, fix)
    # The length test comes first so int() never sees thousands of digits.
    if len(count_text.lstrip("0")) > len(str(MAX_COUNT)) or int(count_text) > MAX_COUNT:
        raise FormatError(field, text, f"a count may be at most {MAX_COUNT:,}")
    return int(count_text)


def _label(request: GresRequest) -> str:
    return f"{request.name}:{request.type}" if request.type else request.name
