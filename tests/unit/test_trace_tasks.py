"""A step's task spans (``libs/trace/tasks.py``): one child of the step span per task its ``StepExited``
lists, with the task's own times, pid and exit, ids stable across derivations, none for an old entry."""

from __future__ import annotations

import msgspec
import pytest
from builders import allocated, job

from corral.libs.trace import derive
from corral.libs.trace.render import render
from corral.libs.trace.spans import SpanRecord, ns, span_id_for
from corral.schemas import codec
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
STEP = {"job_id": 1, "attempt": 0, "step_id": 0, "node": "n1"}


def outcome(rank: int, node: str, **kw: object) -> ev.TaskOutcome:
    """A task that ran from T0+4.25+rank to T0+4.75+rank (inside its step: T0+4 .. T0+5 for rank 0)."""
    times = {"pid": 100 + rank, "started_at": T0 + 4.25 + rank / 10, "ended_at": T0 + 4.75 + rank / 10}
    return ev.TaskOutcome(rank=rank, node=node, **(times | kw))  # type: ignore[arg-type]


def entries(exited: ev.StepExited, attempt: int = 0) -> list[tuple[int, ev.Envelope]]:
    """A 2-node job whose run (attempt ``attempt``) has one srun step, ended by ``exited``; one s apart."""
    bodies: list[ev.Event] = [ev.JobSubmitted(job_id=1, user="alice", spec=job(gpus=1, nodes=2))]
    for k in range(attempt):
        bodies += [
            allocated(1, {"n1": [0], "n2": [0]}, attempt=k),
            ev.JobRequeued(job_id=1, attempt=k, reason="Requested"),
        ]
    bodies += [
        allocated(1, {"n1": [0], "n2": [0]}, attempt=attempt),
        ev.RunStarted(job_id=1, attempt=attempt, node="n1", pid=7),
        ev.StepStarted(**STEP | {"attempt": attempt}, name="hostname", nodes=["n1", "n2"], ntasks=2),  # type: ignore[arg-type]
        exited,
    ]
    start = T0 + 1 - len(bodies) + 5  # so that StepStarted is at T0+4 and StepExited at T0+5
    return [
        (seq, codec.envelope(b, actor="t", occurred_at=start + seq - 1, event_id=f"e{seq}"))
        for seq, b in enumerate(bodies, start=1)
    ]


def by_name(spans: list[SpanRecord]) -> dict[str, SpanRecord]:
    return {s.name: s for s in spans}


def two_tasks(**kw: object) -> ev.StepExited:
    tasks = [outcome(0, "n1"), outcome(1, "n2", exit_code=3)]
    return ev.StepExited(**STEP | kw, exit_code=3, tasks=tasks)  # type: ignore[arg-type]


def test_each_task_is_a_child_of_its_step_with_its_own_times_pid_and_exit() -> None:
    log = entries(two_tasks())
    spans = by_name(derive.spans(1, log))
    step = spans["step 1.0 hostname"]
    first, second = spans["task 0 n1"], spans["task 1 n2"]
    assert first.parent_id == step.span_id and second.parent_id == step.span_id
    assert first.kind == "task" and (first.start_ns, first.end_ns) == (ns(T0 + 4.25), ns(T0 + 4.75))
    assert (second.start_ns, second.end_ns) == (ns(T0 + 4.35), ns(T0 + 4.85))
    assert first.attributes == {
        "host.name": "n1",
        "corral.task.rank": 0,
        "corral.step.id": 0,
        "process.exit.code": 0,
        "corral.run.signal": 0,
        "corral.run.oom": False,
        "corral.attempt": 0,
        "process.pid": 100,
    }
    assert second.attributes["process.exit.code"] == 3 and second.attributes["process.pid"] == 101
    # They end at the StepExited entry, as the step does: the tracer exports them together.
    assert first.end_seq == second.end_seq == step.end_seq == len(log)
    assert (first.status, second.status, step.status) == ("unset", "error", "error")


def test_task_span_ids_are_the_same_on_every_derivation_and_name_the_step_and_rank() -> None:
    log = entries(two_tasks(attempt=1), attempt=1)
    first, again = derive.spans(1, log), derive.spans(1, list(reversed(log)))
    assert first == again
    spans = by_name(first)
    trace = spans["task 1 n2"].trace_id
    assert spans["task 1 n2"].span_id == span_id_for(trace, 1, 1, "task:0:1", "task")
    assert spans["task 1 n2"].attributes["corral.attempt"] == 1
    ids = [s.span_id for s in first]
    assert len(set(ids)) == len(ids)


def test_an_old_step_exited_without_tasks_gives_no_task_spans() -> None:
    # As written before tasks were recorded: the JSON has neither field.
    old = msgspec.json.decode(
        b'{"type": "step_exited", "job_id": 1, "attempt": 0, "step_id": 0, "node": "n1", "exit_code": 0}',
        type=ev.Event,
    )
    assert isinstance(old, ev.StepExited) and (old.tasks, old.tasks_omitted) == ([], 0)
    spans = derive.spans(1, entries(old))
    assert [s for s in spans if s.kind == "task"] == []
    assert by_name(spans)["step 1.0 hostname"].end_ns == ns(T0 + 5)


def test_unknown_times_are_the_steps_start_and_end_and_a_lost_task_is_an_error() -> None:
    lost = ev.TaskOutcome(rank=1, node="n2", signal=9, error="node n2: the task was lost")
    exited = ev.StepExited(**STEP, exit_code=0, signal=9, tasks=[outcome(0, "n1"), lost], tasks_omitted=3)  # type: ignore[arg-type]
    spans = by_name(derive.spans(1, entries(exited)))
    task, step = spans["task 1 n2"], spans["step 1.0 hostname"]
    assert (task.start_ns, task.end_ns) == (step.start_ns, step.end_ns) == (ns(T0 + 4), ns(T0 + 5))
    assert "process.pid" not in task.attributes
    assert (task.status, task.status_message) == ("error", "node n2: the task was lost")
    assert task.attributes["corral.task.error"] == "node n2: the task was lost"
    assert step.attributes["corral.step.tasks_omitted"] == 3


def test_a_killed_steps_tasks_are_not_errors_and_an_oom_says_so() -> None:
    tasks = [outcome(0, "n1", signal=15), outcome(1, "n2", exit_code=0, signal=9, oom=True)]
    killed = ev.StepExited(**STEP, exit_code=0, signal=15, killed=True, tasks=tasks)  # type: ignore[arg-type]
    spans = by_name(derive.spans(1, entries(killed)))
    assert {spans[n].status for n in ("task 0 n1", "task 1 n2")} == {"unset"}
    oom = ev.StepExited(**STEP, exit_code=0, oom=True, tasks=[outcome(0, "n1", oom=True, signal=9)])  # type: ignore[arg-type]
    task = by_name(derive.spans(1, entries(oom)))["task 0 n1"]
    assert (task.status, task.status_message, task.attributes["corral.run.oom"]) == (
        "error",
        "out of memory",
        True,
    )


def test_corral_trace_draws_the_tasks_under_their_step() -> None:
    text = render(1, derive.spans(1, entries(two_tasks())), now_ns=ns(T0 + 10))
    lines = text.splitlines()
    [step] = [i for i, line in enumerate(lines) if "step 1.0 hostname" in line]
    assert "├─ task 0 n1" in lines[step + 1] and "└─ task 1 n2 ✗" in lines[step + 2], text
    # indented one level deeper than the step
    assert lines[step + 1].index("task") == lines[step].index("step") + 3
