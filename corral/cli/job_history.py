"""One job's log entries, for ``corral trace``: the one place the commands read a job's history for its spans.

``job_entries(ref)`` (a job ``N`` or an array task ``A_T``) asks the gateway's ``history`` verb
(``services/gateway/history.py``), which resolves ``A_T`` as ``scancel`` does, so the same rule as
``corral audit`` decides who may see it: a user their own jobs, the auditor and admin roles every job; anyone
else is refused, naming the job and the rule. The reply holds the job's entries (its subjects, its
steps', an array task's submission and whole-array cancels) and the causes outside them (the ``NodeDown`` of a
requeue, a preemptor's allocation), which the derivation (``libs/trace/derive.py``) reads beside them. The
nodes' registrations (their GPUs' type) are not in a job's history: a span names the GPU type the job asked
for; the tracer, which reads the whole log, also names the type of untyped requests' nodes.
"""

from __future__ import annotations

from corral.cli.client import find_cluster
from corral.cli.jobrefs import JobRef
from corral.schemas import api
from corral.schemas import events as ev
from corral.schemas.api_requests import MAX_HISTORY


def job_entries(ref: JobRef) -> tuple[int, list[tuple[int, ev.Envelope]], float]:
    """The job's own id (an ``A_T`` task's, as the gateway resolved it), the log entries about it and their
    causes in log order, and the time of the newest (how far an open span has run); CliError when the
    cluster refuses (naming a job that does not exist) or cannot be reached."""
    task = None if ref.tasks is None else ref.tasks[0]
    request = api.HistoryRequest(job_id=ref.job_id, array_task=task, limit=MAX_HISTORY)
    reply = find_cluster().history(request)
    found = sorted({e.seq: e for e in (*reply.entries, *reply.causes)}.values(), key=lambda e: e.seq)
    entries = [(e.seq, e.envelope) for e in found]
    job_id = reply.job_id if reply.job_id is not None else ref.job_id
    return job_id, entries, max((env.meta.occurred_at for _, env in entries), default=0.0)
