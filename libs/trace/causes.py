"""Why a run ended: the entry that caused a requeue or a conclusion, as span event attributes.

The entry's ``causation_id`` names its cause when the writer set it (the event id of the causing entry).
Without it the cause is looked up among the entries of the run, newest first: a ``NodeDown`` of one of the
run's nodes for a node failure, the ``JobPreempted`` for a preemption, the ``JobRequeueRequested`` or
``JobCancelRequested`` of the user who asked, the ``RunExited`` that reached the time limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.libs.trace.spans import AttrValue
from corral.schemas import events as ev


class Causes:
    """The entries a job's spans are derived from, indexed to find causes."""

    def __init__(self, entries: Sequence[tuple[int, ev.Envelope]]) -> None:
        self.entries = entries  # in log order
        self.by_id = {env.meta.event_id: (seq, env) for seq, env in entries}

    def of(
        self, env: ev.Envelope, seq: int, job_id: int, nodes: Sequence[ev.NodeAllocation], since_seq: int
    ) -> dict[str, AttrValue]:
        """The cause of the requeue or conclusion ``env`` (at ``seq``) of the run that began at ``since_seq``
        as attributes (``{}`` when none is known or needed, e.g. a job that completed)."""
        named = self.by_id.get(env.meta.causation_id or "")
        cause = (
            named[1]
            if named is not None and named[0] < seq
            else self._find(env.body, seq, job_id, nodes, since_seq)
        )
        return describe(cause) if cause is not None else {}

    def _find(
        self, body: ev.Event, seq: int, job_id: int, nodes: Sequence[ev.NodeAllocation], since_seq: int
    ) -> ev.Envelope | None:
        reason = getattr(body, "reason", None)
        names = {a.node for a in nodes}
        wanted: type[ev.Event] | None = None
        if isinstance(body, ev.JobCancelled):
            wanted = ev.JobCancelRequested
        elif reason == "NodeFail":
            wanted = ev.NodeDown
        elif reason == "Preempted":
            wanted = ev.JobPreempted
        elif reason == "Requested":
            wanted = ev.JobRequeueRequested
        elif reason == "TimeLimit":
            wanted = ev.RunExited
        if wanted is None:
            return None
        for at_seq, env in reversed(self.entries):
            if at_seq >= seq or (at_seq < since_seq and wanted is not ev.JobCancelRequested):
                continue
            cause = env.body
            if not isinstance(cause, wanted):
                continue
            if isinstance(cause, ev.NodeDown):
                if cause.node in names:
                    return env
            elif isinstance(cause, ev.RunExited):
                if cause.job_id == job_id and cause.timed_out:
                    return env
            elif getattr(cause, "job_id", None) == job_id or (
                isinstance(cause, ev.JobCancelRequested) and cause.whole_array
            ):
                return env
        return None


def describe(env: ev.Envelope) -> dict[str, AttrValue]:
    """A causing entry as attributes: its type and event id, and who or what it names."""
    body = env.body
    attributes: dict[str, AttrValue] = {
        "corral.cause": type(body).__name__,
        "corral.cause.event_id": env.meta.event_id,
        "corral.cause.actor": env.meta.actor,
    }
    if isinstance(body, ev.NodeDown):
        attributes |= {"corral.cause.node": body.node, "corral.cause.reason": body.reason}
        if body.by:
            attributes["corral.cause.user"] = body.by
    elif isinstance(body, ev.JobPreempted):
        attributes |= {"corral.preempt.by_job": body.by_job, "corral.preempt.mode": body.mode}
    elif isinstance(body, ev.JobRequeueRequested | ev.JobCancelRequested):
        attributes["corral.cause.user"] = body.user
    elif isinstance(body, ev.RunExited):
        attributes |= {"corral.cause.node": body.node, "corral.cause.reason": "time limit"}
    return attributes
