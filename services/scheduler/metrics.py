"""The scheduler's metrics: the queue and the GPUs as its state has them after each cycle, the cycle's
duration, and each job's wait from submission to its first allocation.

The samples are pure functions of the state and the cycle's plan (``pending_samples``, ``gpu_samples``,
``account_samples``); ``SchedulerMetrics.cycled`` swaps them into the gauges at once (``metrics.Snapshot``),
at most once every ``REFRESH_S``: a cycle within that of the last refresh leaves it to a timer at its end,
which reads the state and plan as they are then. Counting is a pass over every pending job (~10 ms for
10,000), and cycles come tens of times a second while jobs flow; Prometheus scrapes every few seconds at most.
A refresh that takes long pushes the next one further: at most a ``REFRESH_SHARE`` of the loop's time goes to
them (a million pending jobs: ~0.4 s a count, so one every ~8 s instead of one every second).

- ``corral_jobs_pending{partition,reason}``: pending jobs by partition and pending reason (squeue's reason
  without its detail: ``Resources``, ``Priority``, ``Dependency``, ``JobHeldUser``...);
- ``corral_gpus{node,gpu_type,state}``: each registered node's GPUs by state, ``allocated`` (held by a run),
  ``idle``, ``drained`` (free on a drained node) or ``down`` (every GPU of a down node); they add up to the
  node's GPUs;
- ``corral_gpus_allocated_by_account{account,partition}``: GPUs held by running jobs, by account;
- ``corral_scheduler_cycle_duration_seconds``: a cycle, plan to the last order sent;
- ``corral_job_submit_to_start_seconds{partition}``: from a job's submission to its first ``JobAllocated``
  (attempt 0; a requeued run's wait is not counted again), observed when that decision is appended.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

from prometheus_client import CollectorRegistry, Histogram

from corral.libs.core.plan import Plan
from corral.libs.core.policy import Policy
from corral.libs.core.reasons import held_reason
from corral.libs.core.state import State, drained
from corral.libs.runtime.metrics import FAST_BUCKETS, WAIT_BUCKETS, Snapshot

#: Seconds between two refreshes of the queue and GPU gauges (the module docstring), at least.
REFRESH_S = 1.0
#: The share of the time the refreshes may take: one that took ``d`` seconds is followed by none for
#: ``d / REFRESH_SHARE`` seconds (if that is more than ``REFRESH_S``).
REFRESH_SHARE = 0.05
#: ``gpu_type`` label of a node that names no GPU model.
NO_TYPE = "none"


def pending_samples(state: State, outlook: Plan, policy: Policy) -> dict[tuple[str, ...], float]:
    """Pending jobs by (partition, reason), as squeue shows them after ``outlook``'s cycle."""
    counts: Counter[tuple[str, ...]] = Counter()
    for job_id in state.active:
        job = state.jobs[job_id]
        if job.state != "PENDING":
            continue
        reason = held_reason(job) or outlook.reasons.get(job_id, "Priority")
        counts[(job.partition or policy.partition_of(job), reason)] += 1
    return {key: float(n) for key, n in counts.items()}


def gpu_samples(state: State) -> dict[tuple[str, ...], float]:
    """Each registered node's GPUs by (node, gpu type, state)."""
    out: dict[tuple[str, ...], float] = {}
    for node in state.nodes.values():
        if node.gpus == 0:
            continue
        kind = node.gpu_type or NO_TYPE
        used = min(len(node.used_gpus), node.gpus)
        free = node.gpus - used
        if not node.up:
            shares = {"allocated": 0, "idle": 0, "drained": 0, "down": node.gpus}
        elif drained(node):
            shares = {"allocated": used, "idle": 0, "drained": free, "down": 0}
        else:
            shares = {"allocated": used, "idle": free, "drained": 0, "down": 0}
        for name, count in shares.items():
            out[(node.name, kind, name)] = float(count)
    return out


def account_samples(state: State, policy: Policy) -> dict[tuple[str, ...], float]:
    """GPUs held by running jobs by (account, partition); an account with none has no sample."""
    counts: Counter[tuple[str, ...]] = Counter()
    for job_id in state.active:
        job = state.jobs[job_id]
        if job.state != "RUNNING":
            continue
        gpus = sum(len(a.gpus) for a in job.allocations)
        if gpus:
            counts[(job.spec.account or job.user, job.partition or policy.partition_of(job))] += gpus
    return {key: float(n) for key, n in counts.items()}


class SchedulerMetrics:
    """The scheduler's families, on the process's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pending = Snapshot(
            "corral_jobs_pending", "Pending jobs by partition and reason", ["partition", "reason"], registry
        )
        self.gpus = Snapshot(
            "corral_gpus", "GPUs by node, GPU type and state", ["node", "gpu_type", "state"], registry
        )
        self.gpus_by_account = Snapshot(
            "corral_gpus_allocated_by_account",
            "GPUs held by running jobs, by account and partition",
            ["account", "partition"],
            registry,
        )
        self.cycle_seconds = Histogram(
            "corral_scheduler_cycle_duration_seconds",
            "Duration of a scheduling cycle (plan, appends, orders)",
            buckets=FAST_BUCKETS,
            registry=registry,
        )
        self.submit_to_start = Histogram(
            "corral_job_submit_to_start_seconds",
            "From a job's submission to its first allocation",
            ["partition"],
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.clock = time.monotonic  # the refreshes' clock
        self._refreshed = -math.inf  # when the gauges were last refreshed
        self._took = 0.0  # how long that refresh took (by ``clock``)
        self._latest: tuple[State, Plan, Policy] | None = None  # the latest cycle's state, plan and policy
        self._timer: asyncio.TimerHandle | None = None  # the refresh a cycle left for later

    def cycled(self, state: State, outlook: Plan, policy: Policy, seconds: float | None) -> None:
        """Record a cycle that took ``seconds`` (None: one that did not plan) and left ``state`` and
        ``outlook``: the gauges now, or within ``REFRESH_S`` of their last refresh (a timer on the running
        loop; without one, now)."""
        if seconds is not None:
            self.cycle_seconds.observe(seconds)
        self._latest = (state, outlook, policy)
        wait = self._refreshed + max(REFRESH_S, self._took / REFRESH_SHARE) - self.clock()
        if wait <= 0:
            self._refresh()
            return
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(wait, self._refresh)
            except RuntimeError:  # no loop (a tool, a test): now
                self._refresh()

    def _refresh(self) -> None:
        """The gauges from the latest cycle's state and plan."""
        if self._timer is not None:
            self._timer.cancel()  # (when a cycle refreshes before it fires)
            self._timer = None
        if self._latest is None:
            return
        state, outlook, policy = self._latest
        self._refreshed = self.clock()
        self.pending.set(pending_samples(state, outlook, policy))
        self.gpus.set(gpu_samples(state))
        self.gpus_by_account.set(account_samples(state, policy))
        self._took = self.clock() - self._refreshed

    def allocated(self, partition: str, waited_s: float) -> None:
        """Record a job's first allocation, ``waited_s`` after its submission."""
        self.submit_to_start.labels(partition).observe(max(waited_s, 0.0))
