"""One job's log entries, for ``corral trace``: the one place the commands read a job's history for its spans.

``job_entries(job_id)`` asks the gateway's ``history`` verb (``services/gateway/history.py``), so the same
rule as ``corral audit`` decides who may see it: a user their own jobs, the auditor and admin roles every job;
anyone else is refused, naming the job and the rule. The reply holds the job's entries (its subjects, its
steps', an array task's submission and whole-array cancels) and the causes outside them (the ``NodeDown`` of a
requeue, a preemptor's allocation), which the derivation (``libs/trace/derive.py``) reads beside them. The
nodes' registrations (their GPUs' type) are not in a job's history: a span names the GPU type the job asked
for; the tracer, which reads the whole log, also names the type of untyped requests' nodes.
"""

from __future__ import annotations

from corral.cli.client import find_cluster
from corral.schemas import api
from corral.schemas import events as ev
from corral.schemas.api_requests import MAX_HISTORY


def job_entries(job_id: int) -> tuple[list[tuple[int, ev.Envelope]], float]:
    """The log entries about job ``job_id`` and their causes in log order, and the time of the newest (how
    far an open span has run); CliError when the cluster refuses or cannot be reached."""
    reply = find_cluster().history(api.HistoryRequest(job_id=job_id, limit=MAX_HISTORY))
    found = sorted({e.seq: e for e in (*reply.entries, *reply.causes)}.values(), key=lambda e: e.seq)
    entries = [(e.seq, e.envelope) for e in found]
    return entries, max((env.meta.occurred_at for _, env in entries), default=0.0)
