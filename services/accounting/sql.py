"""Executing projection operations in PostgreSQL, and the consumer's position beside them.

The caller runs ``lock_position``, ``apply_ops`` and ``save_position`` in one transaction: the
rows and the position commit together or not at all. ``lock_position`` takes the position row
``FOR UPDATE``, so consumers that share a name apply their batches one at a time.

Every statement is fixed text; its ``:name`` placeholders are filled from the fields of the
operation as bind parameters. The guards (``last_seq < :seq`` and the state conditions) are those
described in ``corral.services.accounting.projection``.
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
    Op,
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
                  num_nodes, num_cpus, num_gpus, workdir, last_seq, qos)
VALUES (:job_id, :name, :user, :account, :partition, 'PENDING', :submit_time, :time_limit_s,
        :num_nodes, :num_cpus, :num_gpus, :workdir, :seq, :qos)
ON CONFLICT (job_id) DO NOTHING
""")

# One row per task, task k (k-th smallest index) being job job_id + k; as in the fold, all or nothing:
# nothing when any id of the block is taken (which also makes a replay a no-op).
_INSERT_ARRAY = _Statement("""
INSERT INTO jobs (job_id, name, user_name, account, partition, state, submit_time, time_limit_s,
                  num_nodes, num_cpus, num_gpus, workdir, last_seq, array_job_id, array_task_id, qos)
SELECT :job_id + task.k - 1, :name, :user, :account, :partition, 'PENDING', :submit_time, :time_limit_s,
       :num_nodes, :num_cpus, :num_gpus, :workdir, :seq, :job_id, task.idx, :qos
FROM unnest(:array_tasks::integer[]) WITH ORDINALITY AS task(idx, k)
WHERE NOT EXISTS (
    SELECT 1 FROM jobs
    WHERE job_id BETWEEN :job_id AND :job_id + cardinality(:array_tasks::integer[]) - 1
)
""")

# A whole-array request marks every task row (the array's id is each task's array_job_id).
_REQUEST_CANCEL = _Statement("""
UPDATE jobs SET cancel_requested_by = :user, last_seq = :seq
WHERE (job_id = :job_id OR (:whole_array AND array_job_id = :job_id)) AND last_seq < :seq
      AND state IN ('PENDING', 'RUNNING') AND cancel_requested_by IS NULL
""")

# Fencing as in the fold: an allocation from an older leader epoch than one already seen is void;
# a current one raises the epoch, if its job exists, whether or not the rest of it applies.
_RAISE_EPOCH = _Statement("""
UPDATE scheduler_epoch SET epoch = :epoch
WHERE epoch <= :epoch AND EXISTS (SELECT 1 FROM jobs WHERE job_id = :job_id)
RETURNING epoch
""")

_START_RUN = _Statement("""
UPDATE jobs SET state = 'RUNNING', partition = :partition, start_time = :start_time, end_time = NULL,
                time_limit_s = :time_limit_s, node_list = :node_list, num_nodes = :num_nodes,
                num_cpus = :num_cpus, num_gpus = :num_gpus, reason = 'None', last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq AND state = 'PENDING' AND restart_count = :attempt
      AND cancel_requested_by IS NULL AND :num_nodes > 0
RETURNING job_id
""")

# Only the latest attempt's batch step is kept: a new allocation overwrites the old attempt's row.
_WRITE_BATCH = _Statement("""
INSERT INTO steps (job_id, step, attempt, name, state, exit_code, signal, start_time, end_time,
                   node_list, num_cpus, num_tasks, num_gpus, last_seq)
VALUES (:job_id, 'batch', :attempt, 'batch', 'RUNNING', 0, 0, :start_time, NULL,
        :batch_node, :batch_cpus, 1, :batch_gpus, :seq)
ON CONFLICT (job_id, step) DO UPDATE SET
    attempt = EXCLUDED.attempt, name = EXCLUDED.name, state = EXCLUDED.state,
    exit_code = EXCLUDED.exit_code, signal = EXCLUDED.signal, start_time = EXCLUDED.start_time,
    end_time = EXCLUDED.end_time, node_list = EXCLUDED.node_list, num_cpus = EXCLUDED.num_cpus,
    num_tasks = EXCLUDED.num_tasks, num_gpus = EXCLUDED.num_gpus, last_seq = EXCLUDED.last_seq
WHERE steps.last_seq < EXCLUDED.last_seq
""")

# A batch step ends once: by its node's exit report or, failing that, by the job's conclusion.
_END_BATCH = _Statement("""
UPDATE steps SET state = :state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                 last_seq = :seq
WHERE job_id = :job_id AND step = 'batch' AND attempt = :attempt AND state = 'RUNNING' AND last_seq < :seq
      AND (:node::text IS NULL OR node_list = :node)
""")

_END_JOB = _Statement("""
UPDATE jobs SET state = :state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                reason = :reason, cancelled_by = :cancelled_by, last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq
      AND ((state = 'RUNNING' AND restart_count = :attempt) OR (state = 'PENDING' AND :attempt = -1))
RETURNING job_id
""")

_REQUEUE_JOB = _Statement("""
UPDATE jobs SET state = 'PENDING', restart_count = restart_count + 1, start_time = NULL, end_time = NULL,
                node_list = '', reason = :reason, last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq AND state = 'RUNNING' AND restart_count = :attempt
RETURNING job_id
""")


# As in the fold: only a pending job's spec changes (a running job keeps its run's limit and partition).
_UPDATE_JOB = _Statement("""
UPDATE jobs SET time_limit_s = :time_limit_s, partition = :partition, last_seq = :seq
WHERE job_id = :job_id AND last_seq < :seq AND state = 'PENDING'
""")


# A step of the attempt the job runs; a replayed or stale start changes nothing.
_START_STEP = _Statement("""
INSERT INTO steps (job_id, step, attempt, name, state, exit_code, signal, start_time, end_time,
                   node_list, num_cpus, num_tasks, num_gpus, last_seq)
SELECT :job_id, :step, :attempt, :name, 'RUNNING', 0, 0, :start_time, NULL,
       :node_list, :num_cpus, :num_tasks, :num_gpus, :seq
FROM jobs WHERE job_id = :job_id AND state = 'RUNNING' AND restart_count = :attempt
ON CONFLICT (job_id, step) DO UPDATE SET
    attempt = EXCLUDED.attempt, name = EXCLUDED.name, state = EXCLUDED.state,
    exit_code = EXCLUDED.exit_code, signal = EXCLUDED.signal, start_time = EXCLUDED.start_time,
    end_time = EXCLUDED.end_time, node_list = EXCLUDED.node_list, num_cpus = EXCLUDED.num_cpus,
    num_tasks = EXCLUDED.num_tasks, num_gpus = EXCLUDED.num_gpus, last_seq = EXCLUDED.last_seq
WHERE steps.last_seq < EXCLUDED.last_seq AND steps.attempt < EXCLUDED.attempt
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

# A new attempt starts with no numbered steps (sacct shows the latest attempt's).
_DROP_OLD_STEPS = _Statement("""
DELETE FROM steps WHERE job_id = :job_id AND step <> 'batch' AND attempt < :attempt
""")


async def lock_position(conn: Connection, consumer: str) -> int:
    """The consumer's position (0 if new), locked until the transaction ends."""
    await conn.execute(
        "INSERT INTO consumer_positions (consumer, last_seq) VALUES ($1, 0) ON CONFLICT DO NOTHING", consumer
    )
    position = await conn.fetchval(
        "SELECT last_seq FROM consumer_positions WHERE consumer = $1 FOR UPDATE", consumer
    )
    return int(position)


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
    """Execute one operation; its guards make it a no-op where the fold would ignore the event."""
    match op:
        case InsertJob():
            await _run(conn, _INSERT_ARRAY if op.array_tasks else _INSERT_JOB, op)
        case RequestCancel():
            await _run(conn, _REQUEST_CANCEL, op)
        case StartRun():
            # The epoch check comes first, as in the fold: a fenced-off allocation changes nothing.
            if await _run(conn, _RAISE_EPOCH, op) and await _run(conn, _START_RUN, op):
                await _run(conn, _WRITE_BATCH, op)
                await _run(conn, _DROP_OLD_STEPS, op)
        case ExitBatch():
            await _run(conn, _END_BATCH, op)
        case EndJob():
            if await _run(conn, _END_JOB, op):
                await _run(conn, _END_BATCH, op, node=None)
                await _run(conn, _END_RUN_STEPS, op)
        case RequeueJob():
            if await _run(conn, _REQUEUE_JOB, op):
                await _run(conn, _END_BATCH, op, node=None, state="REQUEUED", exit_code=0, signal=0)
                await _run(conn, _END_RUN_STEPS, op)
        case UpdateJob():
            await _run(conn, _UPDATE_JOB, op)
        case StartStep():
            await _run(conn, _START_STEP, op)
        case EndStep():
            await _run(conn, _END_STEP, op)


async def _run(conn: Connection, statement: _Statement, op: Op, **extra: Any) -> bool:
    """Execute ``statement`` for ``op``; True if it changed (or, with RETURNING, returned) a row."""
    if "RETURNING" in statement.text:
        return await conn.fetchval(statement.text, *statement.args(op, **extra)) is not None
    status: str = await conn.execute(statement.text, *statement.args(op, **extra))
    return not status.endswith(" 0")
