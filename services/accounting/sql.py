"""Executing projection operations in PostgreSQL, and the consumer's position beside them.

The caller runs ``lock_position``, ``apply_ops`` and ``save_position`` in one transaction: the
rows and the position commit together or not at all. ``lock_position`` takes the position row
``FOR UPDATE``, so two holders of one accounting partition apply its batches one at a time; the partitions
have a row each (and disjoint rows to write: ``owners.py``), so they commit side by side.

Every statement is fixed text; its ``:name`` placeholders are filled from the fields of the
operation as bind parameters. Which operations there are is the scheduler fold's decision
(``corral.services.accounting.folded``); the statements repeat none of its guards. A job row's only guard
is ``last_seq < :seq`` (applying an operation twice is a no-op); a step row keeps its own (a step is
one attempt's, ``(job, attempt, step)``: it starts once and ends once).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from corral.libs.runtime import store
from corral.libs.runtime.store import Connection
from corral.services.accounting.projection import (
    EndJob,
    EndStep,
    ExitBatch,
    InsertJob,
    NodeChange,
    Op,
    RaiseEpoch,
    RequestCancel,
    RequeueJob,
    StartRun,
    StartStep,
    UpdateJob,
)


def migrations() -> list[store.Migration]:
    """Accounting's schema: the numbered files of ``services/accounting/migrations/``."""
    return store.migrations("corral.services.accounting")


_PLACEHOLDER = re.compile(r"(?<!:):([a-z_]+)")


class _Statement:
    """SQL with ``:name`` placeholders, compiled once to asyncpg's numbered ``$n`` parameters."""

    def __init__(self, text: str) -> None:
        names: list[str] = []

        def number(match: re.Match[str]) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        self.text = _PLACEHOLDER.sub(number, text)
        self.names = tuple(names)

    def args(self, op: Op, **extra: Any) -> list[Any]:
        """The parameters, in placeholder order, from ``op``'s fields and ``extra``."""
        values = {**msgspec.structs.asdict(op), **extra}
        return [values[name] for name in self.names]


_INSERT_JOB = _Statement("""
INSERT INTO jobs (job_id, name, user_name, account, partition, state, submit_time, time_limit_s,
                  num_nodes, num_cpus, num_gpus, workdir, last_seq, qos,
                  req_nodes, req_cpus, req_gpus, req_mem_mb, gpu_type)
VALUES (:job_id, :name, :user, :account, :partition, 'PENDING', :submit_time, :time_limit_s,
        :num_nodes, :num_cpus, :num_gpus, :workdir, :seq, :qos,
        :num_nodes, :num_cpus, :num_gpus, :mem_mb, :gpu_type)
ON CONFLICT (job_id) DO NOTHING
""")

# One row per task, task k (k-th smallest index) being job job_id + k, of the tasks the accounting partition
# owns (``owners.share``). The fold admits an array only if none of its ids is taken (all or nothing), so a
# task's id can only be taken by the same task: a replay, which changes nothing (``ON CONFLICT``); another
# partition inserts the other tasks of the block beside these.
_INSERT_ARRAY = _Statement("""
INSERT INTO jobs (job_id, name, user_name, account, partition, state, submit_time, time_limit_s,
                  num_nodes, num_cpus, num_gpus, workdir, last_seq, array_job_id, array_task_id, qos,
                  req_nodes, req_cpus, req_gpus, req_mem_mb, gpu_type)
SELECT :job_id + task.k - 1, :name, :user, :account, :partition, 'PENDING', :submit_time, :time_limit_s,
       :num_nodes, :num_cpus, :num_gpus, :workdir, :seq, :job_id, task.idx, :qos,
       :num_nodes, :num_cpus, :num_gpus, :mem_mb, :gpu_type
FROM unnest(:array_tasks::integer[]) WITH ORDINALITY AS task(idx, k)
WHERE (:job_id + task.k - 1) % :owners = :owner
ON CONFLICT (job_id) DO NOTHING
""")

# One row per operation: the projector turns a whole-array request into one per task the fold marked.
_REQUEST_CANCEL = _Statement("""
UPDATE jobs SET cancel_requested_by = :user, last_seq = :seq WHERE job_id = :job_id AND last_seq < :seq
""")

# The highest leader epoch the fold has seen in a decision (fencing is the fold's).
_RAISE_EPOCH = _Statement("""
UPDATE scheduler_epoch SET epoch = :epoch WHERE epoch < :epoch
""")

_START_RUN = _Statement("""
UPDATE jobs SET state = 'RUNNING', partition = :partition, start_time = :start_time, end_time = NULL,
                time_limit_s = :time_limit_s, node_list = :node_list, num_nodes = :num_nodes,
                num_cpus = :num_cpus, num_gpus = :num_gpus, restart_count = :attempt, reason = 'None',
                alloc_mem_mb = :mem_mb, last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq
RETURNING job_id
""")

# Every attempt keeps its row (sacct -D, sreport); the fold allocates an attempt once.
_INSERT_ATTEMPT = _Statement("""
INSERT INTO attempts (job_id, attempt, state, partition, start_time, end_time, node_list, num_nodes,
                      num_cpus, num_gpus, mem_mb, last_seq)
VALUES (:job_id, :attempt, 'RUNNING', :partition, :start_time, NULL, :node_list, :num_nodes,
        :num_cpus, :num_gpus, :mem_mb, :seq)
ON CONFLICT (job_id, attempt) DO NOTHING
""")

# An attempt ends once: with the job's conclusion, or with its requeue.
_END_ATTEMPT = _Statement("""
UPDATE attempts SET state = :state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                    reason = :reason, last_seq = :seq
WHERE job_id = :job_id AND attempt = :attempt AND end_time IS NULL AND last_seq < :seq
""")

# A node's open period ends where the next one starts (a replayed change finds it closed already).
_CLOSE_NODE_PERIOD = _Statement("""
UPDATE node_periods SET end_time = :at, last_seq = :seq
WHERE node = :node AND end_time IS NULL AND last_seq < :seq
""")

_OPEN_NODE_PERIOD = _Statement("""
INSERT INTO node_periods (node, start_seq, start_time, end_time, cpus, gpus, available, last_seq)
VALUES (:node, :seq, :at, NULL, :cpus, :gpus, :available, :seq)
ON CONFLICT (node, start_seq) DO NOTHING
""")

# Each attempt has its own batch step (sacct -D shows it under that attempt); the fold allocates an
# attempt once, so a replayed allocation finds its row and changes nothing.
_WRITE_BATCH = _Statement("""
INSERT INTO steps (job_id, step, attempt, name, state, exit_code, signal, start_time, end_time,
                   node_list, num_cpus, num_tasks, num_gpus, last_seq)
VALUES (:job_id, 'batch', :attempt, 'batch', 'RUNNING', 0, 0, :start_time, NULL,
        :batch_node, :batch_cpus, 1, :batch_gpus, :seq)
ON CONFLICT (job_id, attempt, step) DO NOTHING
""")

# A batch step ends once: by its node's exit report or, failing that, by the job's conclusion.
_END_BATCH = _Statement("""
UPDATE steps SET state = :state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                 last_seq = :seq
WHERE job_id = :job_id AND step = 'batch' AND attempt = :attempt AND state = 'RUNNING' AND last_seq < :seq
""")

_END_JOB = _Statement("""
UPDATE jobs SET state = :state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                reason = :reason, cancelled_by = :cancelled_by, last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq
RETURNING job_id
""")

_REQUEUE_JOB = _Statement("""
UPDATE jobs SET state = 'PENDING', restart_count = :attempt + 1, start_time = NULL, end_time = NULL,
                node_list = '', reason = :reason, last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq
RETURNING job_id
""")


_UPDATE_JOB = _Statement("""
UPDATE jobs SET time_limit_s = :time_limit_s, partition = :partition, last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq
""")


# A step of the attempt the job runs (the fold's rule decides), kept with that attempt; a replayed start
# changes nothing.
_START_STEP = _Statement("""
INSERT INTO steps (job_id, step, attempt, name, state, exit_code, signal, start_time, end_time,
                   node_list, num_cpus, num_tasks, num_gpus, last_seq)
SELECT :job_id, :step, :attempt, :name, 'RUNNING', 0, 0, :start_time, NULL,
       :node_list, :num_cpus, :num_tasks, :num_gpus, :seq
FROM jobs WHERE job_id = :job_id
ON CONFLICT (job_id, attempt, step) DO NOTHING
""")

_END_STEP = _Statement("""
UPDATE steps SET state = :state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                 last_seq = :seq
WHERE job_id = :job_id AND step = :step AND attempt = :attempt AND state = 'RUNNING' AND last_seq < :seq
""")

# The numbered steps still running when their run ends (their exit report was lost, or comes later).
_END_RUN_STEPS = _Statement("""
UPDATE steps SET state = 'CANCELLED', end_time = :end_time, last_seq = :seq
WHERE job_id = :job_id AND step <> 'batch' AND attempt = :attempt AND state = 'RUNNING' AND last_seq < :seq
""")


async def lock_position(conn: Connection, consumer: str, partitions: int = 1) -> int:
    """The position of ``consumer`` (a partition of ``partitions``), locked until the transaction ends.

    A new position row starts at ``start_position``: where the projection of an earlier partition count
    had got to (0 on a new database)."""
    exists = await conn.fetchval("SELECT 1 FROM consumer_positions WHERE consumer = $1", consumer)
    if exists is None:
        await conn.execute(
            "INSERT INTO consumer_positions (consumer, last_seq, partitions) VALUES ($1, $2, $3)"
            " ON CONFLICT DO NOTHING",
            consumer,
            await start_position(conn, partitions),
            partitions,
        )
    position = await conn.fetchval(
        "SELECT last_seq FROM consumer_positions WHERE consumer = $1 FOR UPDATE", consumer
    )
    return int(position)


async def start_position(conn: Connection, partitions: int) -> int:
    """Where a new partition of ``partitions`` starts: every row is applied up to there.

    The rows of one partition count ``Q`` are all applied up to the lowest position of its ``Q``
    partitions (if all ``Q`` have a row: one that never ran applied nothing); of the counts used before,
    the best such position is taken. Whatever the new partition applies again past it changes nothing."""
    position = await conn.fetchval(
        """
        SELECT max(low) FROM (
            SELECT partitions, min(last_seq) AS low, count(*) AS held FROM consumer_positions
            WHERE partitions <> $1 GROUP BY partitions
        ) AS earlier WHERE held = partitions
        """,
        partitions,
    )
    return int(position or 0)


async def save_position(conn: Connection, consumer: str, seq: int) -> None:
    """Move the consumer's position forward to ``seq`` (never back)."""
    await conn.execute(
        "UPDATE consumer_positions SET last_seq = $2 WHERE consumer = $1 AND last_seq < $2", consumer, seq
    )


async def read_position(conn: Connection, consumer: str) -> int:
    """The consumer's position without locking it (0 if it has none)."""
    position = await conn.fetchval("SELECT last_seq FROM consumer_positions WHERE consumer = $1", consumer)
    return int(position or 0)


async def apply_ops(conn: Connection, ops: list[Op]) -> None:
    """Execute ``ops`` in order on ``conn`` (inside the caller's transaction)."""
    for op in ops:
        await apply_op(conn, op)


async def apply_op(conn: Connection, op: Op) -> None:
    """Execute one operation (one the fold applied); a second time it is a no-op."""
    match op:
        case InsertJob():
            await _run(conn, _INSERT_ARRAY if op.array_tasks else _INSERT_JOB, op)
        case RequestCancel():
            await _run(conn, _REQUEST_CANCEL, op)
        case StartRun():
            if await _run(conn, _START_RUN, op):
                await _run(conn, _INSERT_ATTEMPT, op)
                await _run(conn, _WRITE_BATCH, op)
        case RaiseEpoch():
            await _run(conn, _RAISE_EPOCH, op)
        case ExitBatch():
            await _run(conn, _END_BATCH, op)
        case EndJob():
            # Slurm: a cancelled job's record shows 0:0, its batch step the signal that ended it (0:15).
            record = {"exit_code": 0, "signal": 0} if op.state == "CANCELLED" else {}
            if await _run(conn, _END_JOB, op, **record):
                await _run(conn, _END_ATTEMPT, op, **record)
                await _run(conn, _END_BATCH, op)
                await _run(conn, _END_RUN_STEPS, op)
        case RequeueJob():
            if await _run(conn, _REQUEUE_JOB, op):
                await _run(conn, _END_ATTEMPT, op, state=op.attempt_state, exit_code=0, signal=0)
                await _run(conn, _END_BATCH, op, state="REQUEUED", exit_code=0, signal=0)
                await _run(conn, _END_RUN_STEPS, op)
        case UpdateJob():
            await _run(conn, _UPDATE_JOB, op)
        case StartStep():
            await _run(conn, _START_STEP, op)
        case EndStep():
            await _run(conn, _END_STEP, op)
        case NodeChange():
            await _run(conn, _CLOSE_NODE_PERIOD, op)
            await _run(conn, _OPEN_NODE_PERIOD, op)


async def _run(conn: Connection, statement: _Statement, op: Op, **extra: Any) -> bool:
    """Execute ``statement`` for ``op``; True if it changed (or, with RETURNING, returned) a row."""
    if "RETURNING" in statement.text:
        return await conn.fetchval(statement.text, *statement.args(op, **extra)) is not None
    status: str = await conn.execute(statement.text, *statement.args(op, **extra))
    return not status.endswith(" 0")
