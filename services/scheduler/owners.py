"""Each user's jobs, for the queries that name their users (``squeue -u`` and ``--me``, the gateway's
MaxSubmitJobs count at each submission), instead of a pass over every job of the state.

The shell keeps it (``Scheduler.apply``: the ids of each submission the fold took, an array's every task; a
rebuild lists the state's jobs), so the fold's state is unchanged. A job the state no longer holds (forgotten
after ``min_job_age``) is dropped from its user's ids when a query or a later submission of that user meets
it: a user's ids are the state's jobs of that user and at most as many again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from corral.libs.core.state import Job, State


class Owners:
    """The ids of each user's jobs (the module docstring)."""

    def __init__(self) -> None:
        self._ids: dict[str, list[int]] = {}  # user -> their job ids, in submission order
        self._kept: dict[str, int] = {}  # user -> how many of them the last pruning kept

    def rebuild(self, state: State) -> None:
        """Every job of ``state``, by user."""
        self._ids = {}
        for job in state.jobs.values():
            self._ids.setdefault(job.user, []).append(job.job_id)
        self._kept = {user: len(ids) for user, ids in self._ids.items()}

    def add(self, state: State, user: str, ids: Iterable[int]) -> None:
        """Jobs of ``user`` the fold took; the ids of the user's forgotten jobs go once they are as many as
        the rest."""
        mine = self._ids.setdefault(user, [])
        mine.extend(ids)
        if len(mine) > 2 * self._kept.get(user, 0) + 64:
            self._prune(state, user)

    def jobs(self, state: State, users: Iterable[str]) -> list[Job]:
        """The state's jobs of ``users``."""
        out: list[Job] = []
        for user in set(users):
            out.extend(self._prune(state, user))
        return out

    def held(self, state: State, user: str) -> Iterator[Job]:
        """The state's jobs of ``user``, without forgetting the ids of the others (``add`` prunes them in
        time): a count asked at each of the user's submissions."""
        jobs = state.jobs
        for job_id in self._ids.get(user, ()):
            job = jobs.get(job_id)
            if job is not None and job.user == user:
                yield job

    def _prune(self, state: State, user: str) -> list[Job]:
        """The state's jobs of ``user``; the ids of those it no longer holds forgotten."""
        jobs = state.jobs
        found: dict[int, Job] = {}
        for job_id in self._ids.get(user, ()):
            job = jobs.get(job_id)
            if job is not None and job.user == user:
                found[job_id] = job
        if found or user in self._ids:
            self._ids[user] = list(found)
            self._kept[user] = len(found)
        return list(found.values())
