"""Whether a pending job may be considered for a start now: holds, dependencies and begin time (pure).

A pending job is *eligible* when it is not held, its dependencies are met and its begin time has
come; only eligible jobs are placed, block their partition or get a reservation. The others show
Slurm's reason, checked in this order:

- ``JobHeldUser`` / ``JobHeldAdmin``: held (``sbatch -H``, ``scontrol hold``);
- ``DependencyNeverSatisfied``: a dependency that can never hold (``afterok`` on a job that failed,
  ``afternotok`` on one that completed; with ``?``, every alternative so). The job stays pending, as
  in Slurm without ``kill_invalid_depend``;
- ``Dependency``: a dependency not met yet;
- ``BeginTime``: ``--begin`` is still in the future (compared with the ``now`` given to ``plan``).

Dependencies are evaluated afresh from the state on every cycle, so they are deterministic in
(state, now). Each item, about its dependee (the job it names):

=============  ==========================================  =====================================
item           met when the dependee                       never met when the dependee
=============  ==========================================  =====================================
after          is not pending, or has run before           (always possible)
afterany       ended (any terminal state)                  (always possible)
afterok        COMPLETED                                   ended in another terminal state
afternotok     ended in a terminal state other than        COMPLETED
               COMPLETED
singleton      no other job of the same name and user is   (always possible)
               running, or pending and submitted earlier
=============  ==========================================  =====================================

A requeued dependee is pending again, not terminal. A dependee the state does not know (the gateway
refuses those at submit) counts as met, as Slurm does for a dependee that was purged.

A job array's id as dependee (``afterok:A``) stands for all its tasks, as in Slurm: ``after`` is met once
every task has started (or ended), ``afterany`` once every task ended, ``afterok`` once every task
COMPLETED (never, as soon as one ended otherwise), ``afternotok`` once every task ended and one of them
did not complete (never, if all completed). A task's own job id names that task alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from corral.libs.core.reasons import PendingReason, held_reason
from corral.libs.core.state import Job, State, array_tasks, is_array
from corral.libs.slurm.dependency import format_item
from corral.schemas.api import TERMINAL_STATES
from corral.schemas.events import Dependency, JobSpec

#: Where one dependency item, or a whole list, stands.
Status = Literal["met", "waiting", "never"]


def needs_check(job: Job) -> bool:
    """False for the common job with no hold, dependency or begin time (no further work)."""
    return bool(job.held) or spec_needs_check(job.spec)


def spec_needs_check(spec: JobSpec) -> bool:
    """Whether the spec alone asks for a check (a dependency or a begin time)."""
    return spec.dependencies is not None or spec.begin_time is not None


class Singletons:
    """Live jobs by (user, name), in submit order: what a ``singleton`` dependency waits for."""

    def __init__(self, state: State) -> None:
        self._state = state
        self._live: dict[tuple[str, str], list[int]] | None = None

    def blocked(self, job: Job) -> bool:
        """True if another job of the same name and user runs, or is pending and was submitted earlier."""
        if self._live is None:
            self._live = {}
            for job_id in self._state.active:
                other = self._state.jobs[job_id]
                self._live.setdefault((other.user, other.spec.name), []).append(job_id)
        mine = (job.submit_time, job.job_id)
        for job_id in self._live.get((job.user, job.spec.name), []):
            other = self._state.jobs[job_id]
            if other.job_id == job.job_id:
                continue
            if other.state == "RUNNING" or (
                other.state == "PENDING" and (other.submit_time, other.job_id) < mine
            ):
                return True
        return False


def item_status(state: State, job: Job, item: Dependency, singletons: Singletons) -> Status:
    """Where one dependency item of ``job`` stands."""
    if item.type == "singleton":
        return "waiting" if singletons.blocked(job) else "met"
    dependee = state.jobs.get(item.job_id)
    if dependee is None:
        return "met"
    if is_array(dependee):
        return _array_status(item, array_tasks(state, dependee.job_id))
    return _job_status(item, dependee)


def _job_status(item: Dependency, dependee: Job) -> Status:
    """Where an item about one job stands."""
    ended = dependee.state in TERMINAL_STATES
    if item.type == "after":
        return "met" if dependee.state != "PENDING" or dependee.restart_count > 0 else "waiting"
    if item.type == "afterany":
        return "met" if ended else "waiting"
    if not ended:
        return "waiting"
    completed = dependee.state == "COMPLETED"
    wanted = completed if item.type == "afterok" else not completed
    return "met" if wanted else "never"


def _array_status(item: Dependency, tasks: list[Job]) -> Status:
    """Where an item about a whole job array (every task of it) stands."""
    if item.type == "after":
        return combine((_job_status(item, task) for task in tasks), any_of=False)
    ended = [task.state in TERMINAL_STATES for task in tasks]
    completed = [task.state == "COMPLETED" for task in tasks]
    if item.type == "afterok" and any(e and not c for e, c in zip(ended, completed, strict=True)):
        return "never"
    if not all(ended):
        return "waiting"
    if item.type == "afterany":
        return "met"
    if item.type == "afterok":
        return "met"
    return "never" if all(completed) else "met"


def combine(statuses: Iterable[Status], any_of: bool) -> Status:
    """A list's status from its items': all of them (``,``) or any one (``?``)."""
    seen = set(statuses)
    if not seen:
        return "met"
    if any_of:
        if "met" in seen:
            return "met"
        return "never" if seen == {"never"} else "waiting"
    if "never" in seen:
        return "never"
    return "waiting" if "waiting" in seen else "met"


def dependency_status(state: State, job: Job, singletons: Singletons | None = None) -> Status:
    """Where a job's whole dependency list stands (``met`` without one)."""
    deps = job.spec.dependencies
    if deps is None:
        return "met"
    ones = singletons if singletons is not None else Singletons(state)
    return combine((item_status(state, job, item, ones) for item in deps.items), deps.any_of)


def pending_reason(state: State, job: Job, now: float, singletons: Singletons) -> PendingReason | None:
    """Why a pending job may not be considered now (Slurm's reason), or None if it is eligible."""
    held = held_reason(job)
    if held is not None:
        return held
    status = dependency_status(state, job, singletons)
    if status == "never":
        return "DependencyNeverSatisfied"
    if status == "waiting":
        return "Dependency"
    if job.spec.begin_time is not None and job.spec.begin_time > now:
        return "BeginTime"
    return None


def dependency_text(state: State, job: Job) -> str:
    """Slurm's ``Dependency=`` text: the items not met yet, each ``(unfulfilled)`` or ``(failed)``.

    Met items are left out, as Slurm drops them; ``""`` (Slurm's ``(null)``) once nothing is left.
    """
    deps = job.spec.dependencies
    if deps is None or job.state != "PENDING":
        return ""
    singletons = Singletons(state)
    shown = []
    for item in deps.items:
        status = item_status(state, job, item, singletons)
        if status != "met":
            shown.append(f"{format_item(item)}({'failed' if status == 'never' else 'unfulfilled'})")
    if dependency_status(state, job, singletons) == "met":
        return ""
    return ("?" if deps.any_of else ",").join(shown)
