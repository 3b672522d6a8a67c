"""Job array indices (``sbatch --array``, ``scancel A_[1-3]``): parse, expand, print.

- ``--array=LIST[%P]``: ``LIST`` is comma-separated items, each ``N``, ``N-M`` or ``N-M:S`` (every S-th
  index from N to M); ``%P`` runs at most P tasks at once. ``0-999%32``, ``1-7:2``, ``1,3,5-9``.
- Indices are 0..``MAX_INDEX``: Slurm's MaxArraySize default is 1001, so an array has at most 1001 tasks
  and its largest index is 1000. Duplicates merge (Slurm keeps the indices in a bitmap).
- ``format_indices`` prints indices as Slurm does (``0-2,5,7``), the form ``A_[0-2,5,7%2]`` uses.

The task with the k-th smallest index is the array's k-th job: its id is the array's id plus k.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Hashable, Sequence
from typing import Protocol, TypeVar

from corral.libs.slurm.errors import FormatError
from corral.schemas.events import ArrayRange, ArraySpec

R = TypeVar("R", bound="ArrayRow")

#: Slurm's MaxArraySize default: at most this many tasks, indices 0..MAX_ARRAY_SIZE - 1.
MAX_ARRAY_SIZE = 1001
#: The largest index an array task may have.
MAX_INDEX = MAX_ARRAY_SIZE - 1

_ITEM = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9})(?::([0-9]{1,9}))?)?")
_FIX = (
    "use indices N, ranges N-M or N-M:STEP joined by commas, optionally %MAX_RUNNING "
    "(e.g. 0-15%4, 1-7:2, 1,3,5-9)"
)


def parse_array(text: str, field: str = "--array") -> ArraySpec:
    """The array ``text`` describes (``0-999%32``); FormatError for a malformed or too large one."""
    value = text.strip()
    items, percent, throttle_text = value.partition("%")
    throttle = 0
    if percent:
        if not throttle_text.isdigit() or len(throttle_text) > 9 or int(throttle_text) == 0:
            raise FormatError(field, text, "the %MAX_RUNNING limit must be a whole number of at least 1")
        throttle = int(throttle_text)
    spec = ArraySpec(ranges=_parse_ranges(items, text, field), throttle=throttle)
    array_indices(spec, field, text)
    return spec


def parse_indices(text: str, field: str = "job id") -> list[int]:
    """The sorted indices of a list without a limit (``1-3,7``), as in ``A_[1-3,7]``."""
    return array_indices(ArraySpec(ranges=_parse_ranges(text.strip(), text, field)), field, text)


def _parse_ranges(items: str, text: str, field: str) -> list[ArrayRange]:
    if not items:
        raise FormatError(field, text, _FIX)
    parts = items.split(",")
    if len(parts) > MAX_ARRAY_SIZE:
        raise FormatError(field, text, f"at most {MAX_ARRAY_SIZE} items")
    ranges = []
    for part in parts:
        match = _ITEM.fullmatch(part)
        if match is None:
            raise FormatError(field, text, _FIX)
        start = int(match[1])
        end = int(match[2]) if match[2] is not None else start
        step = int(match[3]) if match[3] is not None else 1
        ranges.append(ArrayRange(start=start, end=end, step=step))
    return ranges


def array_indices(spec: ArraySpec, field: str = "array", text: str | None = None) -> list[int]:
    """The array's indices in ascending order; FormatError if the spec is out of bounds.

    Bounded work whatever the spec holds (the fold calls it on what the log says): at most
    ``MAX_ARRAY_SIZE`` ranges, each within 0..``MAX_INDEX``.
    """
    shown = text if text is not None else format_spec(spec)
    if not spec.ranges or len(spec.ranges) > MAX_ARRAY_SIZE:
        raise FormatError(field, shown, f"an array has 1 to {MAX_ARRAY_SIZE} items")
    if spec.throttle < 0:
        raise FormatError(field, shown, "the %MAX_RUNNING limit must be a whole number of at least 1")
    seen = [False] * MAX_ARRAY_SIZE
    for item in spec.ranges:
        if item.step < 1:
            raise FormatError(field, shown, "a range's :STEP must be at least 1")
        if item.start < 0 or item.end < item.start:
            raise FormatError(field, shown, "a range N-M needs 0 <= N <= M")
        if item.end > MAX_INDEX:
            raise FormatError(
                field,
                shown,
                f"array index {item.end} is too large: indices go from 0 to {MAX_INDEX} "
                f"(MaxArraySize={MAX_ARRAY_SIZE})",
            )
        for index in range(item.start, item.end + 1, item.step):
            seen[index] = True
    return [index for index, present in enumerate(seen) if present]


def format_indices(indices: list[int]) -> str:
    """Sorted indices in Slurm's compressed form: ``[0, 1, 2, 5, 7]`` -> ``0-2,5,7``."""
    out: list[str] = []
    i = 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        out.append(str(indices[i]) if i == j else f"{indices[i]}-{indices[j]}")
        i = j + 1
    return ",".join(out)


def format_spec(spec: ArraySpec) -> str:
    """An array as ``--array`` takes it (``0-15:4%2``)."""
    items = []
    for item in spec.ranges:
        text = str(item.start) if item.end == item.start else f"{item.start}-{item.end}"
        items.append(text if item.step == 1 else f"{text}:{item.step}")
    return ",".join(items) + (f"%{spec.throttle}" if spec.throttle else "")


def index_step(indices: list[int]) -> int:
    """``SLURM_ARRAY_TASK_STEP``: the gap between indices when they are evenly spaced, else 1."""
    gaps = {b - a for a, b in itertools.pairwise(indices)}
    return gaps.pop() if len(gaps) == 1 else 1


class ArrayRow(Protocol):
    """A row of squeue or sacct that may be an array task."""

    @property
    def job_id(self) -> int: ...
    @property
    def array_job_id(self) -> int | None: ...  # (squeue's JobInfo: 0 for a job that is no array task)
    @property
    def array_task_id(self) -> int | None: ...


def pending_array_rows(
    jobs: Sequence[R],
    group: Callable[[R], Hashable | None],
    throttle: Callable[[R], int] = lambda job: 0,
    indices: Callable[[R], Sequence[int]] | None = None,
) -> tuple[list[R], dict[int, str]]:
    """Slurm's view of a pending array (squeue and sacct): the tasks that never ran, by ``group`` (None for a
    job that is not such a task), are one row ``A_[x-y%P]`` until they start, shown with the lowest task's
    fields where the first of them was. ``indices``: the tasks a job stands for, when a row of ``jobs`` may
    stand for several (squeue's ``JobInfo.array_tasks``); each job its own task otherwise.

    Returns the rows and the JobID of each aggregated row by its job id."""
    groups: dict[Hashable, list[R]] = {}
    for job in jobs:
        if job.array_task_id is not None and (key := group(job)) is not None:
            groups.setdefault(key, []).append(job)
    rows: list[R] = []
    labels: dict[int, str] = {}
    for job in jobs:
        key = group(job) if job.array_task_id is not None else None
        members = groups.get(key) if key is not None else None
        if members is None or (len(members) == 1 and (indices is None or len(indices(job)) < 2)):
            rows.append(job)
        elif job is members[0]:
            first = min(members, key=lambda task: task.array_task_id or 0)
            if indices is None:
                tasks = sorted(task.array_task_id or 0 for task in members)
            else:
                tasks = sorted(i for task in members for i in indices(task))
            limit = f"%{throttle(first)}" if throttle(first) else ""
            labels[first.job_id] = f"{first.array_job_id}_[{format_indices(tasks)}{limit}]"
            rows.append(first)
    return rows, labels
