"""squeue's pending arrays as the scheduler sends them: an array's tasks that never ran and would show alike
are one row, as Slurm's controller keeps them in one record until they start (pure).

Without ``-r`` squeue shows the pending tasks of an array that never ran, with the same reason, as one row
``A_[x-y%P]`` (``squeue.aggregate_arrays``). It used to be given every task: a sweep of 50 arrays of 1,001
tasks was 50,050 rows, 42 MB of JSON in 14 pages, for 50 lines on the screen. Asked with
``JobsRequest.collapse_arrays``, the scheduler sends such tasks as one row each group of them that would
show alike: the lowest task's ``JobInfo`` with every member's index in ``array_tasks``.

What "alike" means keeps squeue's output exactly as it was. Two tasks are alike when their ``Job`` is equal
but for the fields a task has of its own that ``job_info`` does not show (``_OWN``), and the plan and the
dependencies say the same of both (reason, planned start, priority, ``Dependency=`` text); ``job_info`` reads
nothing else of a job. Alike tasks differ in their id and index alone, so every filter squeue applies to a
row and every sort key but a reversed job id treats each of them as it treats the row (squeue does not ask
for rows with ``-j``, ``-r`` or ``-S -i``). Squeue merges the rows of an array with the same reason again,
so tasks that are not alike (one held, or updated by ``scontrol update``) still show in the one ``A_[...]``
row they showed in before.

Pages: a row stands for tasks up to a larger id than its own, so a page ends between arrays, never inside
one (an array's ids are consecutive: no other job comes between its tasks), and says the largest id it
covers (``JobsReply.last_job_id``), from which the next page starts.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator

import msgspec

from corral.libs.core.plan import Plan
from corral.libs.core.state import NO_CAUSES, Job
from corral.schemas.api import JobInfo

#: A task's own fields that ``job_info`` does not show: its id and index, its log positions, trace and the
#: bookkeeping of its causes and logged reason. Blanked before two tasks are compared.
_OWN: dict[str, object] = {
    "job_id": 0,
    "array_task_id": 0,
    "last_seq": 0,
    "submit_seq": 0,
    "traceparent": None,
    "causes": NO_CAUSES,
    "queued_by": "",
    "logged_reason": None,
}


class Row(msgspec.Struct):
    """A row of the reply: its job (the lowest of the tasks it stands for) and those tasks."""

    job: Job  # what the row shows
    tasks: list[int]  # the indices of the tasks it stands for, its own first (none: a job alone)


class Unit(msgspec.Struct):
    """Rows a page does not split: an array's, or one job's."""

    rows: list[Row]  # by their job's id
    last_id: int  # the largest job id they stand for


def units(shown: Iterable[Job], outlook: Plan, dependency: Callable[[Job], str]) -> Iterator[Unit]:
    """``shown`` (by id) as rows, in units a page does not split: an array's rows together, every other job
    a unit of its own. Tasks that never ran and are alike (the module docstring) share a row. Each unit as
    soon as it is whole (an array's once a job of another comes), so that a page takes only what it shows."""
    unit: Unit | None = None  # the array's unit being filled
    array = -1  # its array
    groups: dict[Hashable, list[tuple[Job, Row]]] = {}  # the array's rows of alike tasks, by what they show
    for job in shown:
        job_id = job.job_id
        if not job.array_job_id:
            if unit is not None:
                yield unit
                unit = None
            yield Unit([Row(job, [])], job_id)
            array = -1
            continue
        if job.array_job_id != array:
            if unit is not None:
                yield unit
            array, groups = job.array_job_id, {}
            unit = Unit([], job_id)
        assert unit is not None
        unit.last_id = job_id
        if job.state != "PENDING" or job.restart_count:
            unit.rows.append(Row(job, []))
            continue
        key = (
            outlook.reason_text(job_id),
            outlook.starts.get(job_id),
            outlook.priorities.get(job_id),
            dependency(job),
        )
        blank = msgspec.structs.replace(job, **_OWN)
        candidates = groups.setdefault(key, [])
        for other, row in candidates:
            if other == blank:
                row.tasks.append(job.array_task_id or 0)
                break
        else:
            row = Row(job, [job.array_task_id or 0])
            candidates.append((blank, row))
            unit.rows.append(row)
    if unit is not None:
        yield unit


def info_of(row: Row, info: JobInfo) -> JobInfo:
    """The row's ``JobInfo``: its job's, with the indices it stands for if they are more than its own."""
    if len(row.tasks) > 1:
        return msgspec.structs.replace(info, array_tasks=tuple(row.tasks))
    return info


def page_units(units: Iterable[tuple[list[JobInfo], int]], bound: int) -> tuple[list[JobInfo], bool, int]:
    """The first whole ``units`` (each its rows and the largest id it covers) whose JSON fits in ``bound``
    bytes (one unit at least, so that paging always ends): the page, whether any was left out, and the
    largest id it covers."""
    out: list[JobInfo] = []
    size, last = 0, 0
    for infos, last_id in units:
        size += sum(len(_encoder.encode(info)) + 1 for info in infos)
        if size > bound and out:
            return out, True, last
        out.extend(infos)
        last = last_id
    return out, False, last


_encoder = msgspec.json.Encoder()
