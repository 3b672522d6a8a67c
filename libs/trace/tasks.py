"""A step's end (``StepExited``) in a job's spans: the step span's outcome, and one child span per task.

    step <job>.<n> <name>      StepStarted → StepExited
    ├── task 0 node1           the task's start → its end, as its node's step supervisor recorded them
    └── task 1 node2

Each task span ends at the ``StepExited`` entry (its ``end_seq``), so the tracer exports it with the step.
Its times are its node's wall clock; a time the entry does not have (0: a task that never started, one
whose node lost it, an entry written before tasks were recorded) is the step's start or the entry's time.
Its id is ``span_id_for(trace, job, attempt, "task:<step>:<rank>", "task")``: the same on every derivation.
A ``StepExited`` without tasks (an old entry) gives none; one that left tasks out (``tasks_omitted``, a step
too large for one entry) says how many on the step span.
"""

from __future__ import annotations

from corral.libs.trace.building import OpenSpan
from corral.libs.trace.spans import AttrValue, ns, span_id_for
from corral.schemas import events as ev


def _failed(exit_code: int, signal: int, oom: bool, error: str = "") -> bool:
    return exit_code != 0 or signal != 0 or oom or bool(error)


def step_ended(
    step: OpenSpan, seq: int, at: float, body: ev.StepExited, trace_id: str, attempt: int
) -> list[OpenSpan]:
    """End the ``step`` span as ``body`` (at log position ``seq``, time ``at``) says; its task spans.

    A task that failed is an error unless the step was killed (its tasks' ends are then the kill's), as
    the step itself."""
    step.attributes |= {
        "process.exit.code": body.exit_code,
        "corral.run.signal": body.signal,
        "corral.run.oom": body.oom,
        "corral.run.killed": body.killed,
    }
    if body.tasks_omitted:
        step.attributes["corral.step.tasks_omitted"] = body.tasks_omitted
    failed = _failed(body.exit_code, body.signal, body.oom)
    step.end(seq, ns(at), "error" if failed and not body.killed else "unset")
    return [_task(step, seq, at, body, task, trace_id, attempt) for task in body.tasks]


def _task(
    step: OpenSpan,
    seq: int,
    at: float,
    body: ev.StepExited,
    task: ev.TaskOutcome,
    trace_id: str,
    attempt: int,
) -> OpenSpan:
    attributes: dict[str, AttrValue] = {
        "host.name": task.node,
        "corral.task.rank": task.rank,
        "corral.step.id": body.step_id,
        "process.exit.code": task.exit_code,
        "corral.run.signal": task.signal,
        "corral.run.oom": task.oom,
        "corral.attempt": attempt,
    }
    if task.pid:
        attributes["process.pid"] = task.pid
    if task.error:
        attributes["corral.task.error"] = task.error
    span = OpenSpan(
        name=f"task {task.rank} {task.node}",
        kind="task",
        span_id=span_id_for(trace_id, body.job_id, attempt, f"task:{body.step_id}:{task.rank}", "task"),
        parent_id=step.span_id,
        start_ns=ns(task.started_at) if task.started_at else step.start_ns,
        attributes=attributes,
    )
    failed = _failed(task.exit_code, task.signal, task.oom, task.error)
    message = task.error or ("out of memory" if task.oom else "")
    span.end(seq, ns(task.ended_at or at), "error" if failed and not body.killed else "unset", message)
    return span
