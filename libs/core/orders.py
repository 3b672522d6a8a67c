"""Per-node work the state still needs: ``orders(state, policy)``.

Derived from the state, never stored: the batch script of a new run to launch, a cancelled, preempted or
requeued run to kill, an orphan to kill, a signal request to deliver. The shell republishes them after a
restart with deterministic message ids, and agents keep a record so that a repeated order is a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from corral.libs.core import preempt
from corral.libs.core.causation import ALLOCATED
from corral.libs.core.state import Job, State
from corral.schemas import api

if TYPE_CHECKING:
    from corral.libs.core.policy import Policy


def orders(state: State, policy: Policy) -> list[api.Order]:
    """Per-node work the state still needs, in a deterministic order; each order carries its job's trace
    context, so that what the agent does and reports is in the job's trace."""
    return [_traced(state, order) for order in _orders(state, policy)]


def _traced(state: State, order: api.Order) -> api.Order:
    job = state.jobs.get(order.job_id)
    if isinstance(order, api.LaunchOrder) or job is None or job.traceparent is None:
        return order
    return msgspec.structs.replace(order, traceparent=job.traceparent)


def _orders(state: State, policy: Policy) -> list[api.Order]:
    out: list[api.Order] = []
    for job_id in state.active:
        job = state.jobs[job_id]
        if job.state != "RUNNING" or not job.allocations or job.run_exit is not None:
            continue
        batch = job.allocations[0].node
        # The run's allocation is the cause of what its agents report of it (``causation.py``).
        cause = job.causes.get(ALLOCATED)
        if not job.run_started:
            out.append(launch_order(job, policy))
        reason = "cancel" if job.cancel_by is not None else "preempt" if job.preempting else "requeue"
        if reason == "preempt":
            out.append(preempt.kill_order(job))
        elif job.cancel_by is not None or job.requeue_by is not None:
            out.append(
                api.KillOrder(
                    job_id=job.job_id, attempt=job.restart_count, node=batch, reason=reason, cause_id=cause
                )
            )
        out.extend(signal_orders(job))
    for orphan in state.orphans:
        out.append(
            api.KillOrder(
                job_id=orphan.job_id,
                attempt=orphan.attempt,
                node=orphan.node,
                reason="requeue",
                cause_id=orphan.cause or None,
            )
        )
    return out


def signal_orders(job: Job) -> list[api.SignalOrder]:
    """The signal orders of a running job's signal requests: to the batch node only for the batch shell
    (``-b``), else to every node of the run (each agent signals what of the run it runs there)."""
    out: list[api.SignalOrder] = []
    for sig in job.signals:
        nodes = job.allocations[:1] if sig.scope == "batch" else job.allocations
        out.extend(
            api.SignalOrder(
                job_id=job.job_id,
                attempt=job.restart_count,
                node=alloc.node,
                signal=sig.signal,
                scope=sig.scope,
                request_id=sig.request_id,
            )
            for alloc in nodes
        )
    return out


def launch_order(job: Job, policy: Policy) -> api.LaunchOrder:
    """The order that starts the batch script of a job's current run on its first node.

    Its ``spec`` is the state's, without the script and the environment: the shell puts back the full
    spec of the submission (the log entry at ``job.submit_seq``) before sending it.
    """
    return api.LaunchOrder(
        job_id=job.job_id,
        attempt=job.restart_count,
        node=job.allocations[0].node,
        user=job.user,
        account=job.spec.account or job.user,
        partition=job.partition,
        spec=job.spec,
        allocations=list(job.allocations),
        time_limit_s=job.time_limit_s,
        cluster=policy.cluster,
        traceparent=job.traceparent,
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        cause_id=job.causes.get(ALLOCATED),
    )
