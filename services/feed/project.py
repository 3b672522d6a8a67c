"""The feed's projection of the log (pure): the scheduler's fold, and the feed messages each entry makes.

``Projector.add(seq, envelope)`` applies the entry with ``libs.core.fold.apply``, the rule every consumer of
the log follows, and compares the jobs and the node the entry is about before and after it: a job that
appeared was submitted, one that moved PENDING -> RUNNING started, RUNNING -> PENDING was requeued, and one
that reached a terminal state ended. So an entry the fold ignores (a deposed leader's decision, a run fact of
a stale attempt, a duplicate submission) makes no message, and the feed says what ``squeue``/``sacct`` say.

Each message comes with its subject and a message id (``<log seq>:<index>``), the same in every pass over
the log, so the publisher's retries, a restart and a second replica add nothing twice (the stream's
duplicate window).
"""

from __future__ import annotations

from itertools import islice

import msgspec

from corral.libs.core import fold
from corral.libs.core.state import Job, Node, State, drain_reason, drained
from corral.libs.slurm.array import array_indices
from corral.schemas import events as ev
from corral.schemas import feed, subjects
from corral.schemas.lifecycle import TERMINAL_STATES


class Published(msgspec.Struct, frozen=True):
    """One feed message to publish."""

    subject: str  # where (``subjects.feed_job_subject`` / ``feed_node_subject``)
    msg_id: str  # its Nats-Msg-Id: ``feed:<log seq>:<index>``
    message: feed.FeedMessage  # what


#: (state, restart count) of a job, what the projection compares.
_Mark = tuple[str, int]


class Projector:
    """The fold's state, and the feed messages of each new entry."""

    def __init__(self, min_job_age_s: float = 0.0) -> None:
        # the fold, forgetting ended jobs as the scheduler does (``libs/core/retention.py``)
        self.state = State(min_job_age_s=min_job_age_s)

    def skip(self, seq: int, subject: str) -> None:
        """An entry that failed to decode: the fold moves past it, the feed says nothing."""
        fold.skip(self.state, seq, subject)

    def add(self, seq: int, env: ev.Envelope) -> list[Published]:
        """Apply the entry at ``seq`` and return the messages it makes (none for a replayed entry)."""
        body = env.body
        job_id = getattr(body, "job_id", None)
        job = self.state.jobs.get(job_id) if isinstance(job_id, int) else None
        before: _Mark | None = (job.state, job.restart_count) if job is not None else None
        node_name = getattr(body, "node", None) if isinstance(body, ev.NODE_EVENTS) else None
        node = self.state.nodes.get(node_name) if node_name else None
        node_before = (node.up, drained(node)) if node is not None else None
        if not fold.apply(self.state, seq, env).applied:
            return []
        events: list[feed.FeedEvent] = []
        if isinstance(body, ev.JobSubmitted):
            # One job per task of an array, at the end of the jobs' insertion order (counted from the
            # submission, not from the jobs: the same entry may have made the fold forget ended ones).
            added = len(array_indices(body.spec.array)) if body.spec.array is not None else 1
            new = reversed(list(islice(reversed(self.state.jobs.values()), added)))
            events += [_submitted(j) for j in new]
        elif job is not None and before is not None:
            events += _moved(job, before, body)
        if node_name:
            node = self.state.nodes.get(node_name)
            if node is not None:
                events += _node_moved(node, node_before)
        return [self._published(seq, i, env.meta.occurred_at, e) for i, e in enumerate(events)]

    def _published(self, seq: int, index: int, at: float, event: feed.FeedEvent) -> Published:
        message = feed.FeedMessage(log_seq=seq, occurred_at=at, event=event)
        if isinstance(event, feed.FeedNode):
            subject = subjects.feed_node_subject(event.node, event.change)
        else:
            job = self.state.jobs[event.job_id]
            kind = type(event).__struct_config__.tag
            assert isinstance(kind, str)
            subject = subjects.feed_job_subject(job.spec.account, job.user, job.job_id, kind)
        return Published(subject=subject, msg_id=f"feed:{seq}:{index}", message=message)


def _submitted(job: Job) -> feed.FeedSubmitted:
    return feed.FeedSubmitted(
        job_id=job.job_id,
        user=job.user,
        account=job.spec.account,
        partition=job.spec.partition,
        name=job.spec.name,
        nodes=job.spec.nodes,
        gpus_per_node=job.spec.gpus_per_node,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
    )


def _moved(job: Job, before: _Mark, body: ev.Event) -> list[feed.FeedEvent]:
    """The messages of a job's move from ``before`` to where it is now."""
    state, attempt = before
    out: list[feed.FeedEvent] = []
    if job.restart_count > attempt:
        reason = body.reason if isinstance(body, ev.JobRequeued) else "Requested"
        out.append(feed.FeedRequeued(job_id=job.job_id, user=job.user, attempt=attempt, reason=reason))
    if job.state == "RUNNING" and state != "RUNNING":
        out.append(
            feed.FeedStarted(
                job_id=job.job_id,
                user=job.user,
                attempt=job.restart_count,
                partition=job.partition,
                nodes=[a.node for a in job.allocations],
                gpus=sum(len(a.gpus) for a in job.allocations),
            )
        )
    if job.state in TERMINAL_STATES and state not in TERMINAL_STATES:
        out.append(
            feed.FeedEnded(
                job_id=job.job_id,
                user=job.user,
                state=job.state,
                exit_code=job.exit_code,
                signal=job.signal,
                reason=job.end_reason,
            )
        )
    return out


def _node_moved(node: Node, before: tuple[bool, bool] | None) -> list[feed.FeedEvent]:
    """A node's availability and drain changes (a node seen the first time: its state if not plain up)."""
    was_up, was_drained = before if before is not None else (True, False)
    out: list[feed.FeedEvent] = []
    if node.up != was_up:
        out.append(feed.FeedNode(node=node.name, change="up" if node.up else "down", reason=node.reason))
    if drained(node) != was_drained:
        change: feed.NodeChange = "drained" if drained(node) else "resumed"
        out.append(feed.FeedNode(node=node.name, change=change, reason=drain_reason(node)))
    return out
