"""Ended jobs forgotten by the fold once they are ``min_job_age_s`` old (Slurm's ``MinJobAge``), pure.

The state kept every job ever submitted: ~1.3 KB an ended job, for ever (a cluster running a million jobs a
month grew its scheduler and every snapshot by ~1.3 GB a month, and a rebuild held them all). Slurm's
controller purges a finished job ``MinJobAge`` (300 s) after it ended; its history is accounting's
(``sacct``). The fold does the same, by the log's clock, so a replay forgets exactly what the live fold
forgot:

- a job that ends (``fold_runs._end``: a job ends once, nothing makes an ended job pending again) joins
  ``State.ended``, the queue of (end time, job id) in end order;
- before each entry is applied, the jobs of the queue whose end is ``min_job_age_s`` older than the log's
  clock as it was before that entry are forgotten (``forget_due``; the entry's own time does not count yet:
  a poison entry's is taken back, ``fold.apply``): removed from ``State.jobs``, their id remembered in
  ``State.forgotten`` (sorted, disjoint ranges: ids are mostly forgotten in runs), so that a submission
  naming one is still a duplicate, as it was while the job was kept;
- unless it is still needed: a job a live job depends on (``State.depended``, counted by dependency item; a
  dependency on a forgotten job would read as met, ``eligibility.item_status``, and an ``afterok`` on a
  failed job would start), and every task of an array while any task of it is live (``State.array_live``:
  the tasks are found from the array's first one, ``state.array_tasks``). Such a job is parked
  (``State.parked``, under its own id or its array's) and joins the queue again, at that moment's time,
  when the count it waited for comes to 0: nothing is looked at twice while it is needed, and the queue
  is only ever appended to in log order.

What the fold does with an entry about a forgotten job is what it does with one about a job it never had:
nothing (a late ``RunExited`` still frees an orphan's resources: orphans are not jobs). ``squeue`` and
``scontrol show job`` no longer show it, as Slurm's do not. ``min_job_age_s`` is a parameter of the fold
kept in the state (0: every job is kept, the default of ``State()``: the simulator and the other folds keep
them all); a snapshot taken under another one is not used (``services/scheduler``).
"""

from __future__ import annotations

from bisect import bisect_right

from corral.libs.core.state import Job, State

#: The queue's consumed head is cut off once it is this long and more than half of the queue.
_CUT = 1024


def job_ended(state: State, job: Job) -> None:
    """A job just ended (once): it joins the queue, and what it was counted for is uncounted (the jobs
    parked for a count that comes to 0 join the queue again)."""
    if not state.min_job_age_s:
        return
    at = job.end_time
    assert at is not None
    state.ended.append((at, job.job_id))
    for dependee in _dependees(job):
        _uncount(state, state.depended, dependee, at)
    if job.array_job_id:
        _uncount(state, state.array_live, job.array_job_id, at)


def _uncount(state: State, counts: dict[int, int], key: int, at: float) -> None:
    left = counts[key] - 1
    if left:
        counts[key] = left
        return
    del counts[key]
    for job_id in state.parked.pop(key, ()):
        state.ended.append((at, job_id))  # (looked at again an age from now: still needed, parked again)


def jobs_submitted(state: State, jobs: list[Job]) -> None:
    """Jobs of one submission (one, or an array's tasks): what they depend on and their array are counted."""
    if not state.min_job_age_s:
        return
    first = jobs[0]
    for dependee in _dependees(first):
        state.depended[dependee] = state.depended.get(dependee, 0) + len(jobs)
    if first.array_job_id:
        state.array_live[first.array_job_id] = len(jobs)


def forget_due(state: State, now: float) -> None:
    """Forget the ended jobs that are ``min_job_age_s`` old at ``now`` and no longer needed; park the others
    (each entry of the queue is looked at once: nothing is appended to it here)."""
    queue, at, age = state.ended, state.ended_from, state.min_job_age_s
    while at < len(queue) and queue[at][0] + age <= now:
        job_id = queue[at][1]
        at += 1
        job = state.jobs.get(job_id)
        if job is None:
            continue
        array = job.array_job_id
        if job_id in state.depended:
            state.parked.setdefault(job_id, []).append(job_id)
        elif array and (array in state.array_live or array in state.depended):
            state.parked.setdefault(array, []).append(job_id)
        else:
            del state.jobs[job_id]
            _remember(state.forgotten, job_id)
    if at >= _CUT and 2 * at > len(queue):
        del queue[:at]
        at = 0
    state.ended_from = at


def is_forgotten(state: State, job_id: int) -> bool:
    """Whether ``job_id`` was a job the fold has forgotten."""
    return bisect_right(state.forgotten, job_id) % 2 == 1


def _remember(bounds: list[int], job_id: int) -> None:
    """Add ``job_id`` to the ranges ``[bounds[0], bounds[1]), [bounds[2], bounds[3]), ...`` (sorted)."""
    i = bisect_right(bounds, job_id)
    if i % 2:
        return  # in a range already
    after_previous = i > 0 and bounds[i - 1] == job_id
    before_next = i < len(bounds) and bounds[i] == job_id + 1
    if after_previous and before_next:
        del bounds[i - 1 : i + 1]  # it joins the two ranges
    elif after_previous:
        bounds[i - 1] = job_id + 1
    elif before_next:
        bounds[i] = job_id
    else:
        bounds[i:i] = [job_id, job_id + 1]


def _dependees(job: Job) -> list[int]:
    """The ids the job's dependencies name (a singleton names none)."""
    deps = job.spec.dependencies
    if deps is None:
        return []
    return [item.job_id for item in deps.items if item.type != "singleton" and item.job_id]
