"""The accounting projection: event sequences become the right row operations (pure, no IO)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from corral.libs.slurm.array import parse_array
from corral.schemas import events as ev
from corral.services.accounting.projection import (
    Batch,
    EndJob,
    ExitBatch,
    InsertJob,
    Op,
    RequestCancel,
    RequeueJob,
    StartRun,
    UpdateJob,
    batch_state,
    convert,
    plan_batch,
)

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
JOB = ev.JobId(7)


def envelope(body: ev.Event, at: float) -> ev.Envelope:
    return ev.Envelope(meta=ev.Meta(event_id=f"id-{at}", occurred_at=at, actor="test"), body=body)


def log(*bodies: ev.Event) -> list[tuple[int, ev.Envelope]]:
    """Entries at sequences 1, 2, ... one second apart."""
    return [(seq, envelope(body, T0 + seq)) for seq, body in enumerate(bodies, start=1)]


def submitted(
    partition: str | None = None,
    nodes: int = 1,
    gpus_per_node: int = 0,
    array: ev.ArraySpec | None = None,
    qos: str | None = None,
) -> ev.JobSubmitted:
    spec = ev.JobSpec(
        name="train",
        script="#!/bin/sh\n",
        workdir="/home/alice",
        partition=partition,
        account="ml",
        nodes=nodes,
        ntasks=4,
        cpus_per_task=2,
        gpus_per_node=gpus_per_node,
        time_limit_s=3600,
        array=array,
        qos=qos,
    )
    return ev.JobSubmitted(job_id=JOB, user="alice", spec=spec)


def allocated(attempt: int = 0, nodes: tuple[str, ...] = ("gpu01",), epoch: int = 0) -> ev.JobAllocated:
    allocations = [ev.NodeAllocation(node=ev.NodeName(n), gpus=[0, 1], cpus=8) for n in nodes]
    return ev.JobAllocated(
        job_id=JOB, attempt=attempt, partition="gpu", allocations=allocations, time_limit_s=3600, epoch=epoch
    )


def exited(attempt: int = 0, node: str = "gpu01", **facts: Any) -> ev.RunExited:
    return ev.RunExited(job_id=JOB, attempt=attempt, node=ev.NodeName(node), **facts)


def insert(
    seq: int = 1,
    partition: str = "batch",
    num_nodes: int = 1,
    num_gpus: int = 0,
    array_tasks: list[int] | None = None,
    qos: str = "",
) -> InsertJob:
    return InsertJob(
        seq=seq,
        job_id=JOB,
        name="train",
        user="alice",
        account="ml",
        partition=partition,
        submit_time=T0 + seq,
        time_limit_s=3600,
        num_nodes=num_nodes,
        num_cpus=8,
        num_gpus=num_gpus,
        workdir="/home/alice",
        array_tasks=array_tasks or [],
        qos=qos,
    )


def start(seq: int, attempt: int = 0, nodes: tuple[str, ...] = ("gpu01",), epoch: int = 0) -> StartRun:
    return StartRun(
        seq=seq,
        job_id=JOB,
        attempt=attempt,
        epoch=epoch,
        partition="gpu",
        start_time=T0 + seq,
        time_limit_s=3600,
        node_list=",".join(nodes) if len(nodes) == 1 else "gpu[01-02]",
        num_nodes=len(nodes),
        num_cpus=8 * len(nodes),
        num_gpus=2 * len(nodes),
        batch_node=nodes[0],
        batch_cpus=8,
        batch_gpus=2,
    )


def end(seq: int, state: str, attempt: int = 0, exit_code: int = 0, signal: int = 0, **more: str) -> EndJob:
    return EndJob(
        seq=seq,
        job_id=JOB,
        attempt=attempt,
        state=state,
        end_time=T0 + seq,
        exit_code=exit_code,
        signal=signal,
        reason=more.get("reason", "None"),
        cancelled_by=more.get("cancelled_by"),
    )


def batch_exit(seq: int, state: str, exit_code: int = 0, signal: int = 0, attempt: int = 0) -> ExitBatch:
    return ExitBatch(
        seq=seq,
        job_id=JOB,
        attempt=attempt,
        node="gpu01",
        end_time=T0 + seq,
        state=state,
        exit_code=exit_code,
        signal=signal,
    )


SEQUENCES: list[tuple[str, list[ev.Event], list[Op]]] = [
    (
        "submit-alloc-exit-completed",
        [submitted(), allocated(), exited(exit_code=0), ev.JobCompleted(job_id=JOB, attempt=0)],
        [insert(), start(2), batch_exit(3, "COMPLETED"), end(4, "COMPLETED")],
    ),
    (
        "failed-with-exit-3",
        [
            submitted(),
            allocated(),
            exited(exit_code=3),
            ev.JobFailed(job_id=JOB, attempt=0, reason="NonZeroExitCode", exit_code=3),
        ],
        [
            insert(),
            start(2),
            batch_exit(3, "FAILED", 3),
            end(4, "FAILED", exit_code=3, reason="NonZeroExitCode"),
        ],
    ),
    (
        "cancelled-while-pending",
        [
            submitted(),
            ev.JobCancelRequested(job_id=JOB, user="alice"),
            ev.JobCancelled(job_id=JOB, attempt=-1, by="alice"),
        ],
        [
            insert(),
            RequestCancel(seq=2, job_id=JOB, user="alice"),
            end(3, "CANCELLED", attempt=-1, signal=15, cancelled_by="alice"),
        ],
    ),
    (
        "requeued-on-node-failure-then-rerun",
        [
            submitted(),
            allocated(),
            ev.JobRequeued(job_id=JOB, attempt=0, reason="NodeFail"),
            allocated(attempt=1, epoch=2),
        ],
        [
            insert(),
            start(2),
            RequeueJob(
                seq=3, job_id=JOB, attempt=0, end_time=T0 + 3, reason="NodeFail", attempt_state="NODE_FAIL"
            ),
            start(4, attempt=1, epoch=2),
        ],
    ),
    (
        "multi-node-gpu-job",
        [submitted(partition="gpu", nodes=2, gpus_per_node=2), allocated(nodes=("gpu02", "gpu01"))],
        [insert(partition="gpu", num_nodes=2, num_gpus=4), start(2, nodes=("gpu02", "gpu01"))],
    ),
    (
        "array-is-one-insert-of-every-task",
        [submitted(array=parse_array("1-7:2%2"))],
        [insert(array_tasks=[1, 3, 5, 7])],
    ),
    (
        "array-of-one-task",
        [submitted(array=parse_array("0"))],
        [insert(array_tasks=[0])],
    ),
    (
        "out-of-bounds-array-is-refused-as-in-the-fold",
        [submitted(array=ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=1001)]))],
        [],
    ),
    (
        "whole-array-cancel",
        [
            submitted(array=parse_array("0-3")),
            ev.JobCancelRequested(job_id=JOB, user="bob", whole_array=True),
            ev.JobCancelRequested(job_id=ev.JobId(9), user="bob"),
        ],
        [
            insert(array_tasks=[0, 1, 2, 3]),
            RequestCancel(seq=2, job_id=JOB, user="bob", whole_array=True),
            RequestCancel(seq=3, job_id=9, user="bob"),
        ],
    ),
    (
        "task-allocation-and-end-are-the-tasks-own",
        [
            submitted(array=parse_array("0-1")),
            ev.JobAllocated(
                job_id=ev.JobId(8),
                attempt=0,
                partition="gpu",
                allocations=[ev.NodeAllocation(node=ev.NodeName("gpu01"), gpus=[0, 1], cpus=8)],
                time_limit_s=3600,
            ),
            ev.JobCompleted(job_id=ev.JobId(8), attempt=0),
        ],
        [
            insert(array_tasks=[0, 1]),
            msgspec.structs.replace(start(2), job_id=8),
            msgspec.structs.replace(end(3, "COMPLETED"), job_id=8),
        ],
    ),
    (
        "qos-as-resolved-at-submit",
        [submitted(qos="scavenger"), submitted(array=parse_array("0-1"), qos="high")],
        [insert(qos="scavenger"), insert(seq=2, array_tasks=[0, 1], qos="high")],
    ),
    (
        "scontrol-update-of-limit-and-partition",
        [
            submitted(),
            ev.JobUpdated(job_id=JOB, by="root", time_limit_s=600, partition="debug"),
            ev.JobUpdated(job_id=JOB, by="root", time_limit_s=None, partition=None, priority=5),
            allocated(),
        ],
        [
            insert(),
            UpdateJob(seq=2, job_id=JOB, time_limit_s=600, partition="debug"),
            UpdateJob(seq=3, job_id=JOB, time_limit_s=None, partition="batch"),
            start(4),
        ],
    ),
    (
        "run-starts-and-node-events-change-no-row",
        [
            ev.NodeRegistered(node=ev.NodeName("gpu01"), cpus=32, mem_mb=1024, gpus=8),
            ev.RunStarted(job_id=JOB, attempt=0, node=ev.NodeName("gpu01"), pid=42),
            ev.NodeDown(node=ev.NodeName("gpu01"), reason="Not responding"),
            ev.NodeUp(node=ev.NodeName("gpu01")),
        ],
        [],
    ),
]


@pytest.mark.parametrize(("events", "expected"), [c[1:] for c in SEQUENCES], ids=[c[0] for c in SEQUENCES])
def test_event_sequence_becomes_operations(events: list[ev.Event], expected: list[Op]) -> None:
    assert convert(log(*events), default_partition="batch") == expected


@pytest.mark.parametrize(
    ("reason", "state"),
    [
        ("NodeFail", "NODE_FAIL"),
        ("OutOfMemory", "OUT_OF_MEMORY"),
        ("TimeLimit", "TIMEOUT"),
        ("LaunchFailed", "FAILED"),
        ("Preempted", "PREEMPTED"),
    ],
)
def test_failure_reason_gives_the_folds_job_state(reason: ev.EndReason, state: str) -> None:
    (op,) = convert(log(ev.JobFailed(job_id=JOB, attempt=0, reason=reason, signal=9)))
    assert op == end(1, state, signal=9, reason=reason)


@pytest.mark.parametrize(
    ("facts", "state"),
    [
        ({"exit_code": 0}, "COMPLETED"),
        ({"exit_code": 1}, "FAILED"),
        ({"exit_code": 0, "signal": 9}, "FAILED"),
        ({"exit_code": 0, "signal": 9, "oom": True}, "OUT_OF_MEMORY"),
        ({"exit_code": 0, "signal": 15, "timed_out": True}, "TIMEOUT"),
        ({"exit_code": 0, "signal": 15, "killed": True}, "CANCELLED"),
        ({"exit_code": 0, "launch_error": "no such directory"}, "FAILED"),
    ],
    ids=["exit-0", "exit-1", "signal", "oom", "time-limit", "killed", "launch-error"],
)
def test_batch_step_state_from_the_exit_report(facts: dict[str, Any], state: str) -> None:
    assert batch_state(exited(**facts)) == state


def test_an_oom_killed_batch_step_shows_slurms_exit_code() -> None:
    # The batch shell exited 137 after its python was OOM-killed; Slurm shows the step as 0:125.
    (op,) = convert(log(exited(exit_code=137, oom=True)))
    assert op == batch_exit(1, "OUT_OF_MEMORY", exit_code=0, signal=125)


def test_invalid_host_name_is_recorded_as_given() -> None:
    (op,) = convert(log(allocated(nodes=("gpu01", "bad name"))))
    assert isinstance(op, StartRun)
    assert op.node_list == "gpu01,bad name"


def test_empty_allocation_still_carries_its_epoch() -> None:
    empty = ev.JobAllocated(
        job_id=JOB, attempt=0, partition="gpu", allocations=[], time_limit_s=None, epoch=3
    )
    (op,) = convert(log(empty))
    assert isinstance(op, StartRun)
    assert (op.epoch, op.num_nodes, op.batch_node) == (3, 0, "")


GOOD = envelope(submitted(), T0)

BATCHES: list[tuple[str, list[tuple[int, ev.Envelope | None]], int, Batch]] = [
    (
        "next-in-order",
        [(5, GOOD), (6, GOOD)],
        4,
        Batch(entries=[(5, GOOD), (6, GOOD)], position=6, rejected=[]),
    ),
    (
        "redelivered-is-skipped",
        [(3, GOOD), (4, GOOD), (5, GOOD)],
        4,
        Batch(entries=[(5, GOOD)], position=5, rejected=[]),
    ),
    (
        "unsorted-delivery",
        [(6, GOOD), (5, GOOD)],
        4,
        Batch(entries=[(5, GOOD), (6, GOOD)], position=6, rejected=[]),
    ),
    (
        "after-a-gap-waits",
        [(5, GOOD), (7, GOOD)],
        4,
        Batch(entries=[(5, GOOD)], position=5, rejected=[], waiting_for=6),
    ),
    (
        "undecodable-is-passed",
        [(5, None), (6, GOOD)],
        4,
        Batch(entries=[(6, GOOD)], position=6, rejected=[5]),
    ),
    ("undecodable-redelivered", [(3, None)], 4, Batch(entries=[], position=4, rejected=[3])),
    ("all-old", [(1, GOOD), (2, GOOD)], 4, Batch(entries=[], position=4, rejected=[])),
]


@pytest.mark.parametrize(
    ("delivered", "position", "expected"), [b[1:] for b in BATCHES], ids=[b[0] for b in BATCHES]
)
def test_batch_applies_strictly_in_log_order(
    delivered: list[tuple[int, ev.Envelope | None]], position: int, expected: Batch
) -> None:
    assert plan_batch(delivered, position) == expected
