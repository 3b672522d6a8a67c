"""The tracer's memory of the log: each live job's entries, and the spans each new entry ends.

``Jobs.file(seq, envelope)`` files an entry under the jobs it concerns (an array's submission and a
whole-array cancel under every task, a ``NodeDown`` under the node); ``take()`` then returns the spans that
the entries filed since the last ``take`` ended (``SpanRecord.end_seq`` among them), deriving each job they
touched once from everything filed so far (``libs.trace.derive``), however many of its entries the batch
holds. ``add`` is both for one entry. A span is therefore produced exactly once per pass over the log,
when its end is read, with the same ids in every pass. A job's entries are forgotten once its job span ended
and the shell ``commit``-ted the spans (a late fact ends no span); until then ``rollback`` files the same
entries again, for a batch whose export failed. A node keeps its newest ``NODE_HISTORY`` downs and
registrations (the causes of requeues; its GPUs' type). The decisions that raised the leader epoch are
kept too (``raises``), and given to every derivation: it fences a deposed leader's decisions as the fold does.

Pure: no IO; the service shell (``app.py``) feeds it and exports what it returns.
"""

from __future__ import annotations

from collections import defaultdict

from corral.libs.slurm.array import array_indices
from corral.libs.slurm.errors import FormatError
from corral.libs.trace import derive
from corral.libs.trace.spans import SpanRecord
from corral.schemas import events as ev
from corral.schemas import lifecycle

#: NodeDown and NodeRegistered entries kept per node.
NODE_HISTORY = 64


class Jobs:
    """Entries of the jobs whose trace is not finished, by job id."""

    def __init__(self) -> None:
        self.entries: dict[int, list[tuple[int, ev.Envelope]]] = defaultdict(list)  # job id -> its entries
        self.arrays: dict[int, int] = {}  # an array's id -> its number of tasks
        # node -> its newest NodeDown and NodeRegistered entries (causes; GPU types)
        self.nodes: dict[str, list[tuple[int, ev.Envelope]]] = defaultdict(list)
        self.position = 0  # the last entry filed
        self.taken = 0  # the last entry whose ended spans ``take`` returned
        self.touched: set[int] = set()  # jobs filed under since the last take
        self.finished: set[int] = set()  # jobs whose job span ended since the last commit
        # The decisions that raised the leader epoch (one per takeover): each job's derivation gets them, so
        # that it fences a deposed leader's decisions as the fold does, whichever job raised the epoch.
        self.raises: list[tuple[int, ev.Envelope]] = []

    @property
    def epoch(self) -> int:
        """The newest leader epoch filed."""
        return self.raises[-1][1].body.epoch if self.raises else 0  # type: ignore[union-attr]

    def add(self, seq: int, envelope: ev.Envelope | None) -> list[SpanRecord]:
        """File the entry at ``seq`` and take the spans it ended."""
        self.file(seq, envelope)
        return self.take()

    def file(self, seq: int, envelope: ev.Envelope | None) -> None:
        """File the entry at ``seq`` under its jobs. An entry at or before ``position`` (redelivered) or one
        that failed to decode (None) concerns no job."""
        if seq <= self.position:
            return
        self.position = seq
        if envelope is None:
            return
        body = envelope.body
        if type(body) in lifecycle.DECISIONS and body.epoch > self.epoch:  # type: ignore[union-attr]
            self.raises.append((seq, envelope))
        if isinstance(body, ev.NodeDown | ev.NodeRegistered):
            facts = self.nodes[body.node]
            if not facts or facts[-1][0] < seq:
                facts.append((seq, envelope))
            del facts[:-NODE_HISTORY]
            if isinstance(body, ev.NodeDown):
                self.touched.update(j for j, es in self.entries.items() if self._ran_on(es, body.node))
            return
        job_ids = self._jobs_of(body)
        for job_id in job_ids:
            entries = self.entries[job_id]
            if not entries or entries[-1][0] < seq:
                entries.append((seq, envelope))
        self.touched.update(job_ids)

    def take(self) -> list[SpanRecord]:
        """The spans ended by the entries filed since the last take, in job order."""
        ended: list[SpanRecord] = []
        for job_id in sorted(self.touched):
            entries = self.entries[job_id]
            nodes = {
                a.node for _, e in entries if isinstance(e.body, ev.JobAllocated) for a in e.body.allocations
            }
            facts = [f for node in sorted(nodes) for f in self.nodes.get(node, [])]
            own = {seq for seq, _ in entries}
            spans = derive.spans(job_id, entries + facts + [r for r in self.raises if r[0] not in own])
            ended += [
                s for s in spans if self.taken < s.end_seq <= self.position and _exported_here(s, job_id)
            ]
            if any(s.kind == "job" and s.end_ns is not None for s in spans):
                self.finished.add(job_id)
        self.touched.clear()
        self.taken = self.position
        return ended

    def commit(self) -> None:
        """The spans returned so far are exported: forget the jobs they finished."""
        for job_id in self.finished:
            self.entries.pop(job_id, None)
        self.finished.clear()
        for array_id in [a for a in self.arrays if not any(j in self.entries for j in self._tasks(a))]:
            del self.arrays[array_id]

    def rollback(self, position: int) -> None:
        """The spans returned after ``position`` were not exported: take those entries again."""
        self.position = self.taken = position
        self.touched.clear()
        self.finished.clear()

    def _jobs_of(self, body: ev.Event) -> list[int]:
        """The jobs an entry is about."""
        job_id = getattr(body, "job_id", None)
        if job_id is None:
            return []
        if isinstance(body, ev.JobSubmitted):
            if job_id in self.entries or job_id in self.arrays:
                return []  # a duplicate submission: the fold ignores it too
            if body.spec.array is None:
                return [job_id]
            try:
                count = len(array_indices(body.spec.array))
            except FormatError:
                return []
            self.arrays[body.job_id] = count
            return list(range(body.job_id, body.job_id + count))
        if isinstance(body, ev.JobCancelRequested) and body.whole_array and job_id in self.arrays:
            return [j for j in self._tasks(job_id) if j in self.entries]
        return [job_id] if job_id in self.entries else []

    @staticmethod
    def _ran_on(entries: list[tuple[int, ev.Envelope]], node: str) -> bool:
        return any(
            isinstance(e.body, ev.JobAllocated) and any(a.node == node for a in e.body.allocations)
            for _, e in entries
        )

    def _tasks(self, array_id: int) -> range:
        return range(array_id, array_id + self.arrays.get(array_id, 1))


def _exported_here(span: SpanRecord, job_id: int) -> bool:
    """The tracer exports the spans derived from the log; an array's submit span once, with its first task."""
    if span.exporter != "tracer":
        return False
    return span.kind != "submit" or span.attributes.get("corral.job.id") == job_id
