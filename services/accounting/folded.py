"""The projection follows the scheduler's fold: a row changes only where the fold applies the entry.

Accounting keeps the fold's state (``corral.libs.core.fold``) beside its tables and asks it about every
entry: an allocation, a run's exit, a conclusion, a requeue, an update or a cancel request is recorded only
if the fold applied it (``Outcome.applied``), and a step fact only if it is about the job's live run
(``fold_runs.live_run``). The SQL repeats none of the fold's guards: it only makes applying an operation
twice a no-op (each row's ``last_seq``). So ``sacct`` shows what the scheduler shows, also where the fold
decides from more than a job's own row: a node that went down between the scheduler's plan and the append
of its ``JobAllocated``, a GPU given twice, an array's throttle, a held job.

Node capacity follows the fold too: after a node event the fold applied, a change of the node's CPUs, GPUs
or availability (down or drained: ``unavailable``) becomes a ``NodeChange`` (sreport's Reported and Down).

``Projector`` is pure: the shell feeds it the entries in log order (``operations``), tells it which
position committed (``committed``), and replays the log into it up to the stored position at start
(``fold_only``). The operations of entries folded but not yet committed are kept, so a transaction that
fails and is retried gives the same operations without folding anything twice.
"""

from __future__ import annotations

import msgspec

from corral.libs.core.fold import apply, skip
from corral.libs.core.fold_runs import live_run
from corral.libs.core.state import Job, Node, State, array_tasks
from corral.schemas import events as ev
from corral.services.accounting.projection import NodeChange, Op, RaiseEpoch, RequestCancel, convert


class Projector:
    """The fold's state as accounting needs it, and the operations of the entries it folded."""

    def __init__(self, default_partition: str = "", min_job_age_s: float = 0.0) -> None:
        self.default_partition = default_partition
        # the fold of the log up to ``state.last_seq``, forgetting ended jobs as the scheduler does (their
        # rows are written; the entries about a forgotten job are ones the fold ignores anyway)
        self.state = State(min_job_age_s=min_job_age_s)
        self.pending: dict[int, list[Op]] = {}  # operations of folded entries not known to be committed
        self.skipped: list[tuple[int, str]] = []  # entries a fold handler failed on, with the error
        self.base = 0  # the position the pending operations follow (the last committed one)

    def fold_only(self, seq: int, envelope: ev.Envelope | None, subject: str = "") -> None:
        """Fold an entry whose rows are stored already (replay up to the stored position); one without an
        event (``envelope`` None) as the scheduler folds it (``fold.skip``)."""
        if envelope is None:
            skip(self.state, seq, subject)
            return
        self._fold(seq, envelope)

    def covers(self, position: int) -> bool:
        """True if the state is exactly at ``position``, or ahead of it only by entries still pending."""
        last = self.state.last_seq
        return last == position or (
            last > position and all(s in self.pending for s in range(position + 1, last + 1))
        )

    def operations(self, entries: list[tuple[int, ev.Envelope]]) -> list[Op]:
        """The operations of ``entries`` (in log order, right after the state or pending), in order."""
        ops: list[Op] = []
        for seq, envelope in entries:
            if seq not in self.pending:
                self.pending[seq] = self._fold(seq, envelope)
            ops.extend(self.pending[seq])
        return ops

    def committed(self, position: int) -> None:
        """The operations up to ``position`` are stored: forget them."""
        for seq in [s for s in self.pending if s <= position]:
            del self.pending[seq]
        self.base = max(self.base, position)

    def _fold(self, seq: int, envelope: ev.Envelope) -> list[Op]:
        """Fold one entry; the operations that record what the fold did with it."""
        state, body = self.state, envelope.body
        if isinstance(body, ev.StepStarted | ev.StepExited):
            # Steps are not folded; the rule is the fold's: a fact counts only for the job's live run.
            counts = live_run(state, body.job_id, body.attempt)
            apply(state, seq, envelope)
            return convert([(seq, envelope)], self.default_partition) if counts else []
        epoch = state.epoch
        targets = _cancel_targets(state, body)
        before = {job.job_id for job in targets if job.cancel_by is not None}
        node_before = _capacity(state, body)
        outcome = apply(state, seq, envelope)
        if outcome.reason == "handler_failed":
            self.skipped.append((seq, outcome.error))
        ops: list[Op] = []
        if outcome.applied:
            ops = convert([(seq, envelope)], self.default_partition)
            if isinstance(body, ev.JobCancelRequested):
                marked = [
                    job.job_id for job in targets if job.cancel_by is not None and job.job_id not in before
                ]
                ops = [_for_job(op, job_id) for op in ops for job_id in marked]
        node_after = _capacity(state, body)
        if node_after is not None and node_after != node_before:
            node, cpus, gpus, available = node_after
            at = envelope.meta.occurred_at
            ops.append(NodeChange(seq=seq, node=node, at=at, cpus=cpus, gpus=gpus, available=available))
        if state.epoch > epoch:
            ops.append(RaiseEpoch(seq=seq, epoch=state.epoch))
        return ops


def _capacity(state: State, body: ev.Event) -> tuple[str, int, int, bool] | None:
    """A node event's node in the fold: name, CPUs, GPUs and availability; None if not a node event or
    the node is not registered."""
    name = getattr(body, "node", None) if isinstance(body, ev.NODE_EVENTS) else None
    node = None if name is None else state.nodes.get(name)
    return None if node is None else (node.name, node.cpus, node.gpus, not unavailable(node))


def unavailable(node: Node) -> bool:
    """True if the node is down or drained (sreport counts its time as Down, as Slurm does)."""
    return not node.up or node.admin_down is not None or bool(node.drain) or node.admin_drain is not None


def _cancel_targets(state: State, body: ev.Event) -> list[Job]:
    """The jobs a cancel request is for (a whole array: its tasks); [] for any other entry."""
    if not isinstance(body, ev.JobCancelRequested) or body.job_id not in state.jobs:
        return []
    return array_tasks(state, body.job_id) if body.whole_array else [state.jobs[body.job_id]]


def _for_job(op: Op, job_id: int) -> Op:
    """A cancel request's operation for one job the fold marked (a whole array: each live task)."""
    assert isinstance(op, RequestCancel)
    return msgspec.structs.replace(op, job_id=job_id, whole_array=False)
