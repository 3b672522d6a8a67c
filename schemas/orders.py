"""Per-node orders (``corral.work.<node>``, the CORRAL_WORK stream): what an agent must do for a run.

The scheduler derives them from its state (``libs/core/orders.py``) and publishes them with the
deterministic message ids of ``order_msg_id``, so a republished order is deduplicated; the agent keeps a
record, so a redelivered one is a no-op.
"""

from __future__ import annotations

import msgspec

from corral.schemas.events import JobSpec, NodeAllocation, SignalScope


class LaunchOrder(msgspec.Struct, frozen=True, tag="launch", kw_only=True):
    """Start the batch script of a run on this node (the run's first node)."""

    job_id: int  # job
    attempt: int  # run number (SLURM_RESTART_COUNT)
    node: str  # the node that runs it
    user: str  # owner
    account: str  # account
    partition: str  # partition
    spec: JobSpec  # the job as submitted
    allocations: list[NodeAllocation]  # the whole run's allocation, first node first
    time_limit_s: int | None  # limit of this run
    cluster: str  # cluster name (SLURM_CLUSTER_NAME)
    traceparent: str | None = None  # trace context of the job
    array_job_id: int = 0  # the array's id for an array task (SLURM_ARRAY_JOB_ID, %A), 0 otherwise
    array_task_id: int | None = None  # the task's index (SLURM_ARRAY_TASK_ID, %a), None if not a task
    cause_id: str | None = None  # event id of the run's JobAllocated: the cause of the agent's facts about it


class KillOrder(msgspec.Struct, frozen=True, tag="kill", kw_only=True):
    """Kill a run on this node (cancel, requeue, lost peer, preemption): SIGCONT+SIGTERM, then SIGKILL
    after ``grace_s`` (a preemption's GraceTime) or, when it is None, after KillWait."""

    job_id: int  # job
    attempt: int  # run number
    node: str  # the node
    reason: str  # "cancel" | "requeue" | "node_fail" | "preempt"
    grace_s: float | None = None  # seconds from SIGTERM to SIGKILL; None = the cluster's KillWait
    traceparent: str | None = None  # trace context of the job
    cause_id: str | None = None  # event id of the run's JobAllocated: the cause of the agent's facts about it


class SignalOrder(msgspec.Struct, frozen=True, tag="signal", kw_only=True):
    """Send a signal to a run on this node without ending it (``scancel -s SIG``): to the tasks of its
    steps, to the batch shell only, or to the batch shell, its children and the steps' tasks (``scope``)."""

    job_id: int  # job
    attempt: int  # run number
    node: str  # the node
    signal: int  # signal number
    scope: SignalScope = "steps"  # steps: the steps' tasks; batch: the batch shell; full: both + its children
    request_id: str  # the signal request's id (one order per request and node)
    traceparent: str | None = None  # trace context of the job


Order = LaunchOrder | KillOrder | SignalOrder


def order_msg_id(order: Order) -> str:
    """Deterministic message id, so a republished order is deduplicated.

    One kill per run and node: whatever the reason (cancel, requeue, preemption), the first kill order
    of a run is the one delivered, and the agent kills a run once anyway (a later kill of a run being
    killed changes nothing), so a cancel during a preemption's grace time waits for the same SIGKILL.
    """
    if isinstance(order, SignalOrder):
        return f"{order.job_id}:{order.attempt}:{order.node}:signal:{order.request_id}"
    kind = "launch" if isinstance(order, LaunchOrder) else "kill"
    return f"{order.job_id}:{order.attempt}:{order.node}:{kind}"
