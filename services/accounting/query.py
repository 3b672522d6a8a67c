"""sacct: an ``AcctRequest`` becomes one parameterised query over ``jobs`` and one over ``steps``.

Filters follow sacct: ``start_after`` (-S) keeps jobs that had not ended by then, ``end_before``
(-E) keeps jobs submitted (eligible) by then, so together they select the jobs that were pending
or running at some moment of the window. A job id that is an array's id also selects every task of the
array (``sacct -j A``), as in Slurm. The SQL text is made only of fixed fragments; every
value the caller sent is a bind parameter.
"""

from __future__ import annotations

import math
from typing import Any, get_args

from corral.libs.runtime.errors import InvalidInput
from corral.libs.runtime.store import Connection
from corral.schemas.api import AcctAttempt, AcctJob, AcctReply, AcctRequest, AcctStep, JobState
from corral.schemas.codec import MAX_REPLY_BYTES, page

#: Most jobs one request may ask for (over all its pages), and most values one filter list may hold.
MAX_LIMIT = 100_000
#: A page: at most this many jobs read (and ``codec.MAX_REPLY_BYTES`` of their JSON sent; a job is ~1 KB, more
#: with many steps).
PAGE_JOBS = 5_000
MAX_FILTER_VALUES = 10_000
MAX_NAME = 256
_JOB_STATES: frozenset[str] = frozenset(get_args(JobState))
_BIGINT_MAX = 2**63 - 1

_JOB_COLUMNS = (
    "job_id, name, user_name, account, partition, state, cancelled_by, exit_code, signal, submit_time,"
    " start_time, end_time, time_limit_s, num_nodes, num_cpus, num_gpus, node_list, restart_count,"
    " workdir, reason, array_job_id, array_task_id, qos, req_nodes, req_cpus, req_gpus, req_mem_mb,"
    " alloc_mem_mb, gpu_type"
)
_STEP_COLUMNS = (
    "job_id, step, name, state, exit_code, signal, start_time, end_time, node_list, num_cpus, num_tasks,"
    " num_gpus"
)
# Each job's steps by attempt ($2: every attempt's, for sacct -D; else only the latest attempt's that has
# steps, the one the job runs or the requeued one it waits after), the batch step first, then numbered
# steps in numeric order (shorter digit strings are smaller).
_STEPS = (
    f"SELECT attempt, {_STEP_COLUMNS} FROM steps s WHERE job_id = ANY($1::bigint[])"
    " AND ($2::boolean OR attempt = (SELECT max(attempt) FROM steps t WHERE t.job_id = s.job_id))"
    " ORDER BY job_id, attempt, step <> 'batch', length(step), step"
)
# The earlier runs of each job (sacct -D): those before the job's row (its latest run, or the pending
# record that follows a requeue).
_EARLIER_ATTEMPTS = (
    "SELECT a.job_id, attempt, a.state, a.partition, a.start_time, a.end_time, a.node_list, a.num_nodes,"
    " a.num_cpus, a.num_gpus, a.mem_mb, a.exit_code, a.signal, a.reason"
    " FROM attempts a JOIN jobs j USING (job_id)"
    " WHERE a.job_id = ANY($1::bigint[]) AND a.attempt < j.restart_count ORDER BY a.job_id, attempt"
)


def validate(req: AcctRequest) -> None:
    """InvalidInput naming the field if the request is out of bounds."""
    if not 1 <= req.limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be between 1 and {MAX_LIMIT}", field="limit")
    lists: list[tuple[str, list[Any]]] = [
        ("job_ids", req.job_ids),
        ("users", req.users),
        ("accounts", req.accounts),
        ("states", req.states),
    ]
    for field, values in lists:
        if len(values) > MAX_FILTER_VALUES:
            raise InvalidInput(f"{field}: at most {MAX_FILTER_VALUES} values", field=field)
    if any(not 1 <= job_id <= _BIGINT_MAX for job_id in req.job_ids):
        raise InvalidInput("job ids are positive integers", field="job_ids")
    if not 0 <= req.after_job_id <= _BIGINT_MAX:
        raise InvalidInput("after_job_id: a job id, or 0 for the first page", field="after_job_id")
    for field, names in (("users", req.users), ("accounts", req.accounts)):
        if any(not 0 < len(name) <= MAX_NAME or "\x00" in name for name in names):
            raise InvalidInput(f"{field}: names are 1-{MAX_NAME} characters", field=field)
    unknown = sorted(set(req.states) - _JOB_STATES)
    if unknown:
        raise InvalidInput(
            f"unknown state {unknown[0]!r}; valid states: {', '.join(sorted(_JOB_STATES))}", field="states"
        )
    for field, value in (("start_after", req.start_after), ("end_before", req.end_before)):
        if value is not None and not math.isfinite(value):
            raise InvalidInput(f"{field} must be a finite Unix time", field=field)


def jobs_query(req: AcctRequest) -> tuple[str, list[Any]]:
    """The jobs query of a (validated) request and its parameters, in job id order: one page's worth
    (``PAGE_JOBS`` at most) after ``after_job_id``."""
    where: list[str] = []
    params: list[Any] = []

    def bind(value: Any) -> str:
        params.append(value)
        return f"${len(params)}"

    if req.job_ids:
        ids = bind(req.job_ids)
        where.append(f"(job_id = ANY({ids}::bigint[]) OR array_job_id = ANY({ids}::bigint[]))")
    if req.users:
        where.append(f"user_name = ANY({bind(req.users)}::text[])")
    if req.accounts:
        where.append(f"account = ANY({bind(req.accounts)}::text[])")
    if req.states:
        where.append(f"state = ANY({bind(req.states)}::text[])")
    if req.start_after is not None:
        where.append(f"(end_time IS NULL OR end_time >= {bind(req.start_after)}::float8)")
    if req.end_before is not None:
        where.append(f"submit_time <= {bind(req.end_before)}::float8")
    if req.after_job_id:
        where.append(f"job_id > {bind(req.after_job_id)}::bigint")
    condition = " AND ".join(where) or "true"
    page = min(req.limit, PAGE_JOBS)
    sql = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {condition} ORDER BY job_id LIMIT {bind(page)}"
    return sql, params


async def acct(conn: Connection, req: AcctRequest) -> AcctReply:
    """Answer a sacct request from the read model (validates it first)."""
    validate(req)
    sql, params = jobs_query(req)
    rows = await conn.fetch(sql, *params)
    steps: dict[tuple[int, int], list[AcctStep]] = {}  # by (job, attempt)
    earlier: dict[int, list[AcctAttempt]] = {}
    if rows:
        ids = [row["job_id"] for row in rows]
        for row in await conn.fetch(_STEPS, ids, req.duplicates):
            steps.setdefault((int(row["job_id"]), int(row["attempt"])), []).append(_step(row))
        if req.duplicates:
            for row in await conn.fetch(_EARLIER_ATTEMPTS, ids):
                attempt = _attempt(row, steps.pop((int(row["job_id"]), int(row["attempt"])), []))
                earlier.setdefault(int(row["job_id"]), []).append(attempt)
    # What is left is each job's own record's: its latest attempt's (without -D), its running one's (-D).
    own: dict[int, list[AcctStep]] = {}
    for (job_id, _), job_steps in sorted(steps.items()):
        own.setdefault(job_id, []).extend(job_steps)
    jobs = [_job(row, own.get(int(row["job_id"]), []), earlier.get(int(row["job_id"]), [])) for row in rows]
    fitting, cut = page(jobs, MAX_REPLY_BYTES)
    full = len(rows) == PAGE_JOBS < req.limit  # the page read all it could: more may follow
    return AcctReply(jobs=fitting, more=cut or full)


def _attempt(row: Any, steps: list[AcctStep]) -> AcctAttempt:
    return AcctAttempt(
        attempt=row["attempt"],
        state=row["state"],
        partition=row["partition"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        node_list=row["node_list"],
        num_nodes=row["num_nodes"],
        num_cpus=row["num_cpus"],
        num_gpus=row["num_gpus"],
        mem_mb=row["mem_mb"],
        exit_code=row["exit_code"],
        signal=row["signal"],
        reason=row["reason"],
        steps=steps,
    )


def _job(row: Any, steps: list[AcctStep], attempts: list[AcctAttempt]) -> AcctJob:
    return AcctJob(
        job_id=row["job_id"],
        name=row["name"],
        user=row["user_name"],
        account=row["account"],
        partition=row["partition"],
        state=row["state"],
        cancelled_by=row["cancelled_by"],
        exit_code=row["exit_code"],
        signal=row["signal"],
        submit_time=row["submit_time"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        time_limit_s=row["time_limit_s"],
        num_nodes=row["num_nodes"],
        num_cpus=row["num_cpus"],
        num_gpus=row["num_gpus"],
        node_list=row["node_list"],
        restart_count=row["restart_count"],
        workdir=row["workdir"],
        reason=row["reason"],
        steps=steps,
        array_job_id=row["array_job_id"],
        array_task_id=row["array_task_id"],
        qos=row["qos"],
        req_nodes=row["req_nodes"],
        req_cpus=row["req_cpus"],
        req_gpus=row["req_gpus"],
        req_mem_mb=row["req_mem_mb"],
        alloc_mem_mb=row["alloc_mem_mb"],
        gpu_type=row["gpu_type"],
        attempts=attempts,
    )


def _step(row: Any) -> AcctStep:
    return AcctStep(
        step=row["step"],
        name=row["name"],
        state=row["state"],
        exit_code=row["exit_code"],
        signal=row["signal"],
        start_time=row["start_time"],
        end_time=row["end_time"],
        node_list=row["node_list"],
        num_cpus=row["num_cpus"],
        num_tasks=row["num_tasks"],
        num_gpus=row["num_gpus"],
    )
