"""Slurm job dependency lists (``sbatch -d``): ``TYPE:ID[:ID...]`` items joined by ``,`` or ``?``.

- ``,`` joins items that must all hold, ``?`` items of which one is enough; only one separator may be
  used in a list, as in Slurm;
- ``after``, ``afterok``, ``afternotok`` and ``afterany`` take one or more job ids; ``afterok:5:6``
  is two items; ``singleton`` takes none;
- Slurm's ``+TIME`` delay suffix (``after:5+10``), ``aftercorr``, ``afterburstbuffer`` and array task
  ids (``5_2``) are refused by name as not supported by Corral yet; an array's id names all its tasks.

``format_dependency`` prints a list back as Slurm does (``afterok:5,afterok:6``); a parse of its output
gives the same list.
"""

from __future__ import annotations

import re

from corral.libs.slurm.errors import FormatError
from corral.schemas.events import Dependencies, Dependency, DependencyType
from corral.schemas.job_spec import MAX_DEPENDENCIES

_FIX = (
    "use TYPE:JOBID[:JOBID...] items joined by , (all of) or ? (any of), TYPE one of after, afterok, "
    "afternotok, afterany; or singleton"
)
#: The kinds that name jobs, by their (lower-case) spelling.
_WITH_IDS: dict[str, DependencyType] = {
    "after": "after",
    "afterok": "afterok",
    "afternotok": "afternotok",
    "afterany": "afterany",
}
_LATER = frozenset({"aftercorr", "afterburstbuffer", "expand"})
_JOB_ID = re.compile(r"[0-9]{1,18}")
#: Most items one list may hold (the schema's bound: ``job_spec.MAX_DEPENDENCIES``).
MAX_ITEMS = MAX_DEPENDENCIES


def parse_dependency(text: str, field: str = "--dependency") -> Dependencies | None:
    """The dependency list ``text`` means; None for an empty list. FormatError for anything else."""
    value = text.strip()
    if not value:
        return None
    if "," in value and "?" in value:
        raise FormatError(field, text, "use either , (all of) or ? (any of) between items, not both")
    any_of = "?" in value
    items: list[Dependency] = []
    for part in value.split("?" if any_of else ","):
        items.extend(_parse_item(part.strip(), text, field))
    if len(items) > MAX_ITEMS:
        raise FormatError(field, text, f"at most {MAX_ITEMS} dependencies per job")
    return Dependencies(items=items, any_of=any_of)


def _parse_item(part: str, text: str, field: str) -> list[Dependency]:
    kind, colon, ids_text = part.partition(":")
    kind = kind.strip().lower()
    if kind == "singleton":
        if colon:
            raise FormatError(field, text, "singleton takes no job id")
        return [Dependency(type="singleton")]
    if kind in _LATER:
        raise FormatError(field, text, f"{kind} dependencies are not supported by Corral yet")
    if kind not in _WITH_IDS or not colon:
        raise FormatError(field, text, _FIX)
    items = []
    for job_text in ids_text.split(":"):
        job = job_text.strip()
        if "+" in job:
            raise FormatError(field, text, "a +TIME delay after a dependency is not supported by Corral yet")
        if "_" in job:
            raise FormatError(
                field,
                text,
                "a dependency on one array task (A_T) is not supported by Corral yet: name the task's own "
                "job id, or the array's id A for all its tasks",
            )
        if not _JOB_ID.fullmatch(job) or int(job) == 0:
            raise FormatError(field, text, _FIX)
        items.append(Dependency(type=_WITH_IDS[kind], job_id=int(job)))
    return items


def format_item(item: Dependency) -> str:
    """One item as Slurm prints it: ``afterok:5``, ``singleton``."""
    return "singleton" if item.type == "singleton" else f"{item.type}:{item.job_id}"


def format_dependency(deps: Dependencies | None) -> str:
    """A whole list as Slurm prints it (``""`` for none)."""
    if deps is None:
        return ""
    return ("?" if deps.any_of else ",").join(format_item(item) for item in deps.items)
