"""Which pending reasons a cycle logs: ``reason_changes(state, plan) -> [JobReasonChanged]`` (pure).

A cycle gives every pending job it does not start a reason (``Plan.reasons``, with ``Plan.details``); the
log keeps only the changes, so that a trace can show why a job waited (the queued span's
``pending_reason`` events) without a write per job and cycle. The rule, in one place:

- a job's reason is logged when it differs (code or detail) from the last one logged for the job *for the
  same attempt* (``Job.logged_reason``, which the fold keeps from the log): a requeued job logs its first
  reason again, in its new queued span;
- at most once per job and cycle: ``Plan.reasons`` has one reason per job;
- a job whose reason is unchanged logs nothing, so a steady queue costs no write, and a scheduler that
  replays the log (or loads a snapshot) logs nothing it logged before.

The cost is one append per change: a queue of N pending jobs costs N appends once, then one per job whose
reason moves (Priority to Resources as the jobs ahead start, a dependency met). The shell appends them
after the cycle's decisions and orders, so they never delay a start.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.libs.core.reasons import PendingReason
from corral.libs.core.state import State
from corral.schemas import events as ev


def reason_changes(
    state: State, reasons: Mapping[int, PendingReason], details: Mapping[int, str], epoch: int = 0
) -> list[ev.JobReasonChanged]:
    """The ``JobReasonChanged`` to append for a cycle's ``reasons`` and ``details`` (a ``Plan``'s), in
    the cycle's order: one per pending job whose reason differs from the one last logged for its attempt;
    each carries the leader ``epoch`` (a decision like any other)."""
    changes: list[ev.JobReasonChanged] = []
    for job_id, reason in reasons.items():
        job = state.jobs.get(job_id)
        if job is None or job.state != "PENDING":
            continue
        detail = details.get(job_id, "")[: ev.MAX_REASON_DETAIL]
        logged = job.logged_reason
        if (
            logged is not None
            and logged.attempt == job.restart_count
            and logged.reason == reason
            and logged.detail == detail
        ):
            continue
        changes.append(
            ev.JobReasonChanged(
                job_id=ev.JobId(job_id), attempt=job.restart_count, reason=reason, detail=detail, epoch=epoch
            )
        )
    return changes
