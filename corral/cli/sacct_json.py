"""``sacct --json``: the jobs in the shape of Slurm's ``data_parser`` (v0.0.40) for the fields Corral has.

Only what the accounting record holds is printed (no TRES usage, no association ids): ``jobs[]`` with
``job_id``, ``name``, ``user``, ``account``, ``partition``, ``qos``, ``state.current`` (a list, as Slurm
prints it) and ``state.reason``, ``exit_code`` (``status``, ``return_code``, ``signal``), ``array``,
``time`` (``submission``, ``start``, ``end``, ``elapsed``, ``limit`` in minutes), ``nodes``,
``restart_cnt``, ``working_directory`` and ``steps[]`` (``step.id`` ``N.batch``/``N.0``, ``step.name``,
``state``, ``exit_code``, ``nodes``, ``tasks``, ``time``). Pure: ``acct_json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corral.schemas.api import AcctJob, AcctStep

#: The data_parser version whose shape this follows.
PLUGIN = "data_parser/v0.0.40"


def _number(value: float | int | None) -> dict[str, Any]:
    """Slurm's optional number: ``{"set", "infinite", "number"}``."""
    return {"set": value is not None, "infinite": False, "number": int(value or 0)}


def _exit_code(code: int, signal: int) -> dict[str, Any]:
    status = "SIGNALED" if signal else "SUCCESS" if code == 0 else "ERROR"
    return {
        "status": [status],
        "return_code": _number(code),
        "signal": {"id": _number(signal if signal else None), "name": ""},
    }


def _elapsed(start: float | None, end: float | None, now: float) -> int:
    if start is None:
        return 0
    return max(int((end if end is not None else now) - start), 0)


def _times(start: float | None, end: float | None, now: float) -> dict[str, Any]:
    return {"start": int(start or 0), "end": int(end or 0), "elapsed": _elapsed(start, end, now)}


def _step(job: AcctJob, step: AcctStep, now: float) -> dict[str, Any]:
    nodes = step.node_list
    return {
        "step": {"id": f"{job.job_id}.{step.step}", "name": step.name},
        "state": [step.state],
        "exit_code": _exit_code(step.exit_code, step.signal),
        "nodes": {"list": [nodes] if nodes else [], "range": nodes, "count": 0 if not nodes else 1},
        "tasks": {"count": step.num_tasks},
        "time": _times(step.start_time, step.end_time, now),
    }


def job_json(job: AcctJob, now: float, steps: bool = True) -> dict[str, Any]:
    """One job as Slurm's ``sacct --json`` prints it."""
    limit = job.time_limit_s
    return {
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "qos": job.qos or "normal",
        "state": {"current": [job.state], "reason": job.reason or "None"},
        "exit_code": _exit_code(job.exit_code, job.signal),
        "array": {
            "job_id": job.array_job_id or 0,
            "task_id": _number(job.array_task_id),
        },
        "time": {
            "submission": int(job.submit_time),
            **_times(job.start_time, job.end_time, now),
            "limit": {"set": limit is not None, "infinite": limit is None, "number": (limit or 0) // 60},
        },
        "nodes": job.node_list or "None assigned",
        "allocation_nodes": job.num_nodes,
        "restart_cnt": job.restart_count,
        "working_directory": job.workdir,
        "steps": [_step(job, step, now) for step in job.steps] if steps else [],
    }


def acct_json(jobs: Sequence[AcctJob], now: float, steps: bool = True) -> str:
    """The whole ``sacct --json`` document; with ``-D`` (the jobs carry their earlier attempts) each earlier
    run is a job record of its own before the job's, as in the columns (``sacct_fields.records``)."""
    from corral.cli.sacct_fields import records

    document = {
        "meta": {"plugin": {"type": "openapi/slurmdbd", "data_parser": PLUGIN, "name": "Corral"}},
        "jobs": [job_json(record, now, steps) for job in jobs for record in records(job)],
        "warnings": [],
        "errors": [],
    }
    return json.dumps(document, indent=2)
