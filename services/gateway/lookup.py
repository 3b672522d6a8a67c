"""Finding a job's submission in the log, for jobs that are array tasks too.

The gateway holds no job state: it reads a job's ``JobSubmitted`` entry by subject
(``corral.evt.job.<id>.job_submitted``). A job array is one entry on its first task's subject, so:

- the array's id ``A`` finds the array itself (``whole_array``: the id stands for every task, as in
  Slurm's ``scancel A``);
- ``A_T`` (an index) maps to the task's job id through the array's indices: the task with the k-th
  smallest index is job ``A + k``;
- a task's own job id ``X`` has no entry of its own: the array it belongs to is the nearest submission
  below it, at most MaxArraySize - 1 ids away (ids are reserved in blocks, so nothing else is in between).
  Those subjects are probed in concurrent chunks, and never above the id counter, so the search is
  bounded and costs nothing for ordinary jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from corral.libs.runtime.errors import InvalidInput
from corral.libs.runtime.ports import EventLog, JobIds, LogEntry
from corral.libs.slurm.array import MAX_ARRAY_SIZE, array_indices
from corral.schemas import events as ev
from corral.schemas import subjects
from corral.schemas.api import ArrayTasks
from corral.schemas.api_requests import MAX_CANCEL

#: Subjects read at once when looking for the array a task id belongs to (nearest first: mostly the first).
PROBE_CHUNK = 64
#: Jobs of one request looked up, or acted on, at once (``at_once``).
AT_ONCE = 256

T = TypeVar("T")
R = TypeVar("R")


async def at_once(items: Sequence[T], act: Callable[[T], Awaitable[R]]) -> list[R]:
    """``act`` on each of ``items``, ``AT_ONCE`` of them at a time (their reads and appends pipelined on the
    connection); the results in ``items``' order. A request of thousands of jobs (``scancel -u``) waits on
    JetStream once per ``AT_ONCE`` of them, not once per job."""
    out: list[R] = []
    for start in range(0, len(items), AT_ONCE):
        out += await asyncio.gather(*(act(item) for item in items[start : start + AT_ONCE]))
    return out


@dataclass(frozen=True)
class Found:
    """A job (or a whole job array, or one task of one) and the submission it came from."""

    submitted: ev.JobSubmitted  # the submission (of the whole array, for a task)
    envelope: ev.Envelope  # its envelope (trace context)
    job_id: int  # the job named: the task's own id for a task, the array's id for a whole array
    task_index: int | None = None  # the task's index for one task of an array
    whole_array: bool = False  # the id named the array: every task

    @property
    def user(self) -> str:
        """The job's owner."""
        return self.submitted.user

    @property
    def job_ids(self) -> list[int]:
        """The jobs this names: every task's id for a whole array, else the one job."""
        array = self.submitted.spec.array
        if not self.whole_array or array is None:
            return [self.job_id]
        first = self.submitted.job_id
        return list(range(first, first + len(array_indices(array))))


class JobLookup:
    """Reads submissions from the log (direct gets by subject)."""

    def __init__(self, events: EventLog, ids: JobIds) -> None:
        self.events = events
        self.ids = ids

    async def submission(self, job_id: int) -> tuple[ev.JobSubmitted, ev.Envelope] | None:
        """The submission appended on this id's own subject, or None."""
        if job_id < 1:
            return None
        return _submission(await self.events.last_entry(subjects.job_subject(job_id, "job_submitted")))

    async def submissions(self, job_ids: Sequence[int]) -> dict[int, tuple[ev.JobSubmitted, ev.Envelope]]:
        """The submissions appended on these ids' own subjects, by id (those that have one), read at once
        (``EventLog.last_entries``: a few requests for thousands of ids)."""
        wanted = {subjects.job_subject(job_id, "job_submitted"): job_id for job_id in job_ids if job_id >= 1}
        out = {}
        for subject, entry in (await self.events.last_entries(list(wanted))).items():
            found = _submission(entry)
            if found is not None and subject in wanted:
                out[wanted[subject]] = found
        return out

    async def find(self, job_id: int) -> Found | None:
        """The job with this id: a job, a whole array (its id), or an array task (its own id)."""
        return _own(job_id, await self.submission(job_id)) or await self._task_by_id(job_id)

    async def task(self, array_job_id: int, index: int) -> Found | None:
        """Task ``A_T``: the task of array ``A`` with index ``T``, or None if there is none."""
        found = await self.submission(array_job_id)
        if found is None or found[0].spec.array is None:
            return None
        return task_of(found[0], found[1], index)

    async def targets(self, job_ids: list[int], tasks: list[ArrayTasks]) -> list[Target]:
        """What each id and each ``A_T`` of a request names (None where nothing), in request order;
        InvalidInput past ``MAX_CANCEL`` jobs."""
        if len(job_ids) + sum(len(t.task_ids) for t in tasks) > MAX_CANCEL:
            raise InvalidInput(f"at most {MAX_CANCEL} jobs per request", field="job_ids")
        own = await self.submissions(job_ids)  # most ids are jobs' and arrays' own: read at once
        # The others are tasks' own ids, or no job's.
        tasks_by_id = [i for i in dict.fromkeys(job_ids) if i not in own]
        by_id = dict(zip(tasks_by_id, await at_once(tasks_by_id, self._task_by_id), strict=True))
        targets = [
            Target(job_id, None, _own(job_id, own.get(job_id)) or by_id.get(job_id)) for job_id in job_ids
        ]
        for named in tasks:
            array = await self.submission(named.array_job_id)
            positions = {} if array is None else task_positions(array[0])  # once per array, not per task
            for index in named.task_ids:
                found = None if array is None else task_of(array[0], array[1], index, positions)
                targets.append(Target(named.array_job_id, index, found))
        return targets

    async def _task_by_id(self, job_id: int) -> Found | None:
        if job_id < 2 or job_id > await self.ids.last_job_id():
            return None
        lowest = max(1, job_id - (MAX_ARRAY_SIZE - 1))
        candidates = list(range(job_id - 1, lowest - 1, -1))
        for start in range(0, len(candidates), PROBE_CHUNK):
            chunk = candidates[start : start + PROBE_CHUNK]
            found = await self.submissions(chunk)
            for entry in (found[c] for c in chunk if c in found):
                # The nearest submission below decides: the id is one of its tasks, or no job at all.
                submitted, envelope = entry
                array = submitted.spec.array
                if array is None:
                    return None
                indices = array_indices(array)
                offset = job_id - submitted.job_id
                if offset >= len(indices):
                    return None
                return Found(submitted, envelope, job_id, task_index=indices[offset])
        return None


def _submission(entry: LogEntry | None) -> tuple[ev.JobSubmitted, ev.Envelope] | None:
    """The submission ``entry`` holds, or None (none there, or unreadable)."""
    if entry is None or entry.envelope is None or not isinstance(entry.envelope.body, ev.JobSubmitted):
        return None
    return entry.envelope.body, entry.envelope


def _own(job_id: int, own: tuple[ev.JobSubmitted, ev.Envelope] | None) -> Found | None:
    """The job or whole array whose submission ``own`` is, appended on ``job_id``'s own subject."""
    if own is None:
        return None
    submitted, envelope = own
    return Found(submitted, envelope, job_id, whole_array=submitted.spec.array is not None)


def task_positions(submitted: ev.JobSubmitted) -> dict[int, int]:
    """Each task index of the array ``submitted`` to its position (the task's id is the array's + it)."""
    if submitted.spec.array is None:
        return {}
    return {value: k for k, value in enumerate(array_indices(submitted.spec.array))}


def task_of(
    submitted: ev.JobSubmitted, envelope: ev.Envelope, index: int, positions: dict[int, int] | None = None
) -> Found | None:
    """The task with ``index`` of the array ``submitted`` (``positions``: its ``task_positions``, if known);
    None if the array has no such index."""
    if submitted.spec.array is None:
        return None
    position = (task_positions(submitted) if positions is None else positions).get(index)
    if position is None:
        return None
    return Found(submitted, envelope, submitted.job_id + position, task_index=index)


@dataclass(frozen=True)
class Target:
    """One job named by a request: an id, or an array's id and a task index, and what it names."""

    job_id: int  # the id as named (the array's id for ``A_T``)
    index: int | None  # the task index of ``A_T``, None for a plain id
    found: Found | None  # the job, array or task; None if there is no such job
