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
from itertools import groupby
from operator import itemgetter
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

# The job turns RUNNING; then, if it did (a replayed allocation changes no row), the attempt gets its row
# and the batch step is written. One statement (data-modifying CTEs on other tables, run only for the row
# the UPDATE returned): one round trip, and a run of them is one pipelined ``executemany`` (``apply_ops``).
# Every attempt keeps its row (sacct -D, sreport) and its own batch step; the fold allocates an attempt once.
_START_RUN = _Statement("""
WITH started AS (
    UPDATE jobs SET state = 'RUNNING', partition = :partition, start_time = :start_time, end_time = NULL,
                    time_limit_s = :time_limit_s, node_list = :node_list, num_nodes = :num_nodes,
                    num_cpus = :num_cpus, num_gpus = :num_gpus, restart_count = :attempt, reason = 'None',
                    alloc_mem_mb = :mem_mb, last_seq = :seq
    WHERE job_id = :job_id AND last_seq < :seq
    RETURNING job_id
), attempt AS (
    INSERT INTO attempts (job_id, attempt, state, partition, start_time, end_time, node_list, num_nodes,
                          num_cpus, num_gpus, mem_mb, last_seq)
    SELECT job_id, :attempt, 'RUNNING', :partition, :start_time, NULL, :node_list, :num_nodes,
           :num_cpus, :num_gpus, :mem_mb, :seq
    FROM started
    ON CONFLICT (job_id, attempt) DO NOTHING
)
INSERT INTO steps (job_id, step, attempt, name, state, exit_code, signal, start_time, end_time,
                   node_list, num_cpus, num_tasks, num_gpus, last_seq)
SELECT job_id, 'batch', :attempt, 'batch', 'RUNNING', 0, 0, :start_time, NULL,
       :batch_node, :batch_cpus, 1, :batch_gpus, :seq
FROM started
ON CONFLICT (job_id, attempt, step) DO NOTHING
""")

# A node's open period ends where the next one starts (a replayed change finds it closed already, and the
# next one there). One statement: the UPDATE does not see the row the INSERT adds (one snapshot).
_NODE_CHANGE = _Statement("""
WITH closed AS (
    UPDATE node_periods SET end_time = :at, last_seq = :seq
    WHERE node = :node AND end_time IS NULL AND last_seq < :seq
)
INSERT INTO node_periods (node, start_seq, start_time, end_time, cpus, gpus, available, last_seq)
VALUES (:node, :seq, :at, NULL, :cpus, :gpus, :available, :seq)
ON CONFLICT (node, start_seq) DO NOTHING
""")

# A batch step ends once: by its node's exit report or, failing that, by the job's conclusion.
_END_BATCH = _Statement("""
UPDATE steps SET state = :state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                 last_seq = :seq
WHERE job_id = :job_id AND step = 'batch' AND attempt = :attempt AND state = 'RUNNING' AND last_seq < :seq
""")

# A job's end (its conclusion, or a requeue): the job row changes; then, if it did, its attempt ends once
# (``end_time IS NULL``), its batch step ends unless its node's exit report ended it already, and its
# numbered steps still running end CANCELLED (their exit report was lost, or comes later). The job and the
# attempt record ``:record_exit_code``/``:record_signal``, the batch step ``:exit_code``/``:signal`` (Slurm:
# a cancelled job shows 0:0, its batch step the signal that ended it). One statement, as ``_START_RUN``.
# The follow-ups name the job by ``:job_id`` (``EXISTS`` only says whether the job row changed): PostgreSQL
# plans a prepared statement once for all values after a few executions, and a join with ``ended`` planned
# so scanned the whole steps table for each job (the projection slowed as the tables grew).
_ENDED = """
), attempt AS (
    UPDATE attempts SET state = :attempt_state, end_time = :end_time, exit_code = :record_exit_code,
                        signal = :record_signal, reason = :reason, last_seq = :seq
    WHERE EXISTS (SELECT FROM ended) AND job_id = :job_id AND attempt = :attempt AND end_time IS NULL
          AND last_seq < :seq
), batch AS (
    UPDATE steps SET state = :batch_state, end_time = :end_time, exit_code = :exit_code, signal = :signal,
                     last_seq = :seq
    WHERE EXISTS (SELECT FROM ended) AND job_id = :job_id AND step = 'batch' AND attempt = :attempt
          AND state = 'RUNNING' AND last_seq < :seq
)
UPDATE steps SET state = 'CANCELLED', end_time = :end_time, last_seq = :seq
WHERE EXISTS (SELECT FROM ended) AND job_id = :job_id AND step <> 'batch' AND attempt = :attempt
      AND state = 'RUNNING' AND last_seq < :seq
"""

_END_JOB = _Statement(
    """
WITH ended AS (
    UPDATE jobs SET state = :state, end_time = :end_time, exit_code = :record_exit_code,
                    signal = :record_signal, reason = :reason, cancelled_by = :cancelled_by, last_seq = :seq
    WHERE job_id = :job_id AND last_seq < :seq
    RETURNING job_id"""
    + _ENDED
)

_REQUEUE_JOB = _Statement(
    """
WITH ended AS (
    UPDATE jobs SET state = 'PENDING', restart_count = :attempt + 1, start_time = NULL, end_time = NULL,
                    node_list = '', reason = :reason, last_seq = :seq
    WHERE job_id = :job_id AND last_seq < :seq
    RETURNING job_id"""
    + _ENDED
)

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


async def lock_position(conn: Connection, consumer: str, partitions: int = 1) -> int:
    """The position of ``consumer`` (a partition of ``partitions``), locked until the transaction ends.

    A new position row starts at ``start_position``: where the projection of an earlier partition count
    had got to (0 on a new database). The row exists but for the first batch: one request then."""
    locked = "SELECT last_seq FROM consumer_positions WHERE consumer = $1 FOR UPDATE"
    position = await conn.fetchval(locked, consumer)
    if position is None:
        await conn.execute(
            "INSERT INTO consumer_positions (consumer, last_seq, partitions) VALUES ($1, $2, $3)"
            " ON CONFLICT DO NOTHING",
            consumer,
            await start_position(conn, partitions),
            partitions,
        )
        position = await conn.fetchval(locked, consumer)
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
    """Execute ``ops`` in order on ``conn`` (inside the caller's transaction); again, they change nothing.

    Each operation is one statement. A run of consecutive operations of one statement (a batch submission's
    jobs, their allocations, their ends) is one ``executemany``, which asyncpg pipelines: one round trip for
    the run instead of one per operation, each operation still executed in order and seeing the ones before
    it (``bench/accounting_projection.py``)."""
    for statement, group in groupby(map(_bound, ops), key=itemgetter(0)):
        rows = [args for _, args in group]
        if len(rows) == 1:
            await conn.execute(statement.text, *rows[0])
        else:
            await conn.executemany(statement.text, rows)


def _bound(op: Op) -> tuple[_Statement, list[Any]]:
    """The statement that applies ``op`` (one the fold applied), and its parameters."""
    match op:
        case InsertJob():
            statement = _INSERT_ARRAY if op.array_tasks else _INSERT_JOB
            return statement, statement.args(op)
        case RequestCancel():
            return _REQUEST_CANCEL, _REQUEST_CANCEL.args(op)
        case StartRun():
            return _START_RUN, _START_RUN.args(op)
        case RaiseEpoch():
            return _RAISE_EPOCH, _RAISE_EPOCH.args(op)
        case ExitBatch():
            return _END_BATCH, _END_BATCH.args(op)
        case EndJob():
            # Slurm: a cancelled job's record shows 0:0, its batch step the signal that ended it (0:15).
            cancelled = op.state == "CANCELLED"
            record = (0, 0) if cancelled else (op.exit_code, op.signal)
            return _END_JOB, _END_JOB.args(
                op,
                attempt_state=op.state,
                batch_state=op.state,
                record_exit_code=record[0],
                record_signal=record[1],
            )
        case RequeueJob():
            return _REQUEUE_JOB, _REQUEUE_JOB.args(
                op, batch_state="REQUEUED", exit_code=0, signal=0, record_exit_code=0, record_signal=0
            )
        case UpdateJob():
            return _UPDATE_JOB, _UPDATE_JOB.args(op)
        case StartStep():
            return _START_STEP, _START_STEP.args(op)
        case EndStep():
            return _END_STEP, _END_STEP.args(op)
        case NodeChange():
            return _NODE_CHANGE, _NODE_CHANGE.args(op)
    raise TypeError(f"no statement applies {type(op).__name__}")
