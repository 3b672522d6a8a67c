"""Which accounting partition applies a row operation, pure: partition ``k`` of ``P`` keeps its own.

Every partition folds the whole log (the fold needs the whole state) and converts every entry into row
operations (``folded.Projector``); ``share`` then keeps those whose row belongs to partition ``k``:

- a job's rows (``jobs``, ``attempts``, ``steps``) belong to partition ``job_id % P`` of the ROW's job id,
  not the event's: an array submission inserts one row per task (ids ``job_id + i``), so its ``InsertJob``
  is kept by every partition that owns a task, marked to insert only those (``owner``/``owners``), and the
  updates of each task row are then applied, in log order, by the partition that inserted it (a row's
  updates are guarded by its ``last_seq``, so they must not race another partition's);
- node capacity (``node_periods``) and the scheduler epoch belong to partition 0 (a few rows, rarely
  written).

Partitions touch disjoint rows, so their transactions commit side by side, each with its own position.
"""

from __future__ import annotations

import msgspec

from corral.services.accounting.ops import InsertJob, NodeChange, Op, RaiseEpoch


def owner(job_id: int, partitions: int) -> int:
    """The partition of job ``job_id``'s rows."""
    return job_id % partitions


def share(ops: list[Op], k: int, partitions: int) -> list[Op]:
    """The operations of ``ops`` that partition ``k`` of ``partitions`` applies, in order."""
    if partitions == 1:
        return ops
    kept: list[Op] = []
    for op in ops:
        if isinstance(op, NodeChange | RaiseEpoch):
            if k == 0:
                kept.append(op)
        elif isinstance(op, InsertJob) and op.array_tasks:
            ids = range(op.job_id, op.job_id + len(op.array_tasks))
            if any(owner(i, partitions) == k for i in ids):
                kept.append(msgspec.structs.replace(op, owner=k, owners=partitions))
        elif owner(op.job_id, partitions) == k:
            kept.append(op)
    return kept
