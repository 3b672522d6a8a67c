"""Job ids as the commands take them: ``N``, an array task ``A_T``, array tasks ``A_[1-3,7]``.

An id ``N`` names one job, or every task of the array whose id it is (Slurm's ``scancel A``); ``A_T``
names the task of array ``A`` with index ``T``. Commands that show jobs ask the cluster for the ids and
keep the rows that a reference names (``matches``); ``scancel`` and ``scontrol hold``/``release`` send
the tasks by index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import msgspec

from corral.cli.errors import CliError
from corral.libs.slurm.array import parse_indices
from corral.libs.slurm.errors import FormatError

if TYPE_CHECKING:
    from corral.schemas.api import ArrayTasks

#: Jobs one control request (cancel, signal, hold, release, requeue) names at most: the API takes up to
#: ``MAX_CANCEL`` (10,000); fewer, so that each request ends well within the command's timeout. A command that
#: names more (``scancel -u`` of a user with tens of thousands of jobs) sends several (``batches``).
CONTROL_BATCH = 2000

_TASKS = re.compile(r"([0-9]{1,18})_(?:([0-9]{1,9})|\[([^\]]*)\])")


class JobRef(msgspec.Struct, frozen=True):
    """A job, a whole array, or some tasks of an array, as named on a command line."""

    job_id: int  # the job's id, or the array's id
    tasks: tuple[int, ...] | None = None  # task indices of ``A_T``/``A_[...]``; None: what ``job_id`` names

    def matches(self, job_id: int, array_job_id: int | None, array_task_id: int | None) -> bool:
        """True if a job (its id, its array's id, its index) is one this reference names."""
        if self.tasks is None:
            return job_id == self.job_id or array_job_id == self.job_id
        return array_job_id == self.job_id and array_task_id in self.tasks


def split_job_list(values: Iterable[str]) -> list[str]:
    """Items of comma lists, commas inside ``[...]`` kept (``5,7_[1,3]`` is ``5`` and ``7_[1,3]``)."""
    items: list[str] = []
    for value in values:
        depth, current = 0, ""
        for char in value:
            depth += {"[": 1, "]": -1}.get(char, 0)
            if char == "," and depth <= 0:
                items.append(current)
                current = ""
            else:
                current += char
        items.append(current)
    return [item.strip() for item in items if item.strip()]


def parse_job_refs(items: Iterable[str], option: str) -> list[JobRef]:
    """References from ``N``, ``A_T`` and ``A_[LIST]`` items; step ids (``12.0``) are refused by name."""
    refs: list[JobRef] = []
    for item in items:
        text = item.strip()
        tasks = _TASKS.fullmatch(text)
        if tasks is not None:
            ref = JobRef(int(tasks[1]), _indices(tasks[2], tasks[3], text, option))
        elif "." in text and text.partition(".")[0].isdigit():
            raise CliError(f"{option} {text}: job steps are not supported here by Corral yet")
        elif text.isdigit() and len(text) <= 18:
            ref = JobRef(int(text))
        else:
            raise CliError(f"Invalid job id {text}")
        if ref.job_id == 0:
            raise CliError(f"Invalid job id {text}")
        if ref not in refs:
            refs.append(ref)
    return refs


def one_job_ref(text: str, argument: str) -> JobRef:
    """One job ``N`` or one array task ``A_T`` (``corral audit``, ``corral trace``), read by
    ``parse_job_refs``; CliError naming ``argument`` for anything else (a list, a step, a malformed id)."""
    usage = f"{argument}: {text!r} is not a job id (a job N or an array task A_T, e.g. 12 or 12_3)"
    try:
        refs = parse_job_refs([text], argument)
    except CliError:
        raise CliError(usage) from None
    if len(refs) != 1 or len(refs[0].tasks or (0,)) != 1:
        raise CliError(usage)
    return refs[0]


def _indices(single: str | None, listed: str | None, text: str, option: str) -> tuple[int, ...]:
    if single is not None:
        return (int(single),)
    try:
        return tuple(parse_indices(listed or "", option))
    except FormatError as exc:
        raise CliError(f"Invalid job id {text}: {exc.fix}") from None


def ids_of(refs: Sequence[JobRef]) -> list[int]:
    """The ids to ask the cluster about (each job or array once)."""
    out: list[int] = []
    for ref in refs:
        if ref.job_id not in out:
            out.append(ref.job_id)
    return out


def named(refs: Sequence[JobRef], job_id: int, array_job_id: int | None, array_task_id: int | None) -> bool:
    """True without references, or if one of them names the job."""
    return not refs or any(ref.matches(job_id, array_job_id, array_task_id) for ref in refs)


def job_label(job_id: int, array_job_id: int | None, array_task_id: int | None) -> str:
    """How squeue's ``%i`` and sacct's JobID show a job: ``A_T`` for an array task, else its id."""
    if array_task_id is None or not array_job_id:
        return str(job_id)
    return f"{array_job_id}_{array_task_id}"


def batches(refs: Sequence[JobRef], size: int = CONTROL_BATCH) -> list[list[JobRef]]:
    """``refs`` in runs, in order, that each name at most ``size`` jobs (an ``A_T`` reference counts one job
    per task, and one with more than ``size`` tasks is split)."""
    out: list[list[JobRef]] = [[]]
    room = size
    for ref in refs:
        tasks = ref.tasks
        while tasks is not None and len(tasks) > room:  # fill this run with some of its tasks, then the next
            if room:
                out[-1].append(JobRef(ref.job_id, tasks[:room]))
                tasks = tasks[room:]
            out.append([])
            room = size
        if not room:
            out.append([])
            room = size
        out[-1].append(ref if tasks is ref.tasks else JobRef(ref.job_id, tasks))
        room -= 1 if tasks is None else len(tasks)
    return [run for run in out if run]


def split_refs(refs: Sequence[JobRef]) -> tuple[list[int], list[ArrayTasks]]:
    """Plain ids, and array tasks grouped by array (indices in the order named)."""
    from corral.schemas.api import ArrayTasks

    job_ids = [ref.job_id for ref in refs if ref.tasks is None]
    by_array: dict[int, list[int]] = {}
    for ref in refs:
        for index in ref.tasks or ():
            indices = by_array.setdefault(ref.job_id, [])
            if index not in indices:
                indices.append(index)
    return job_ids, [ArrayTasks(array_job_id=a, task_ids=indices) for a, indices in by_array.items()]
