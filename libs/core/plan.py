"""The scheduling cycle: ``plan(state, now, policy) -> Plan``.

Pure: the shell publishes the returned decisions and only then considers them applied, when they
come back through the log and ``state.apply`` folds them. One cycle:

1. conclude runs whose batch script exited (COMPLETED, FAILED, TIMEOUT, OUT_OF_MEMORY, CANCELLED;
   ``conclude.py``);
2. conclude runs that lost a node (requeue if the job allows it, NODE_FAIL otherwise);
3. cancel pending jobs whose cancel was requested; answer hold, release and update requests
   (``JobHeld``, ``JobReleased``, ``JobUpdated``; one decision per job and cycle, and such a job is
   not placed in the same cycle);
4. set aside pending jobs that are not eligible (``eligibility.py``: held, dependency not met,
   begin time not come): they show their reason, are never placed, block nothing and get no
   reservation; ``Plan.wake_at`` is the next begin time, for the shell to plan again then;
5. place the eligible jobs in queue order through the backfill planner: the first job of a
   partition that does not fit blocks the ones behind it (reason ``Resources`` for it,
   ``Priority`` for them), so small jobs cannot starve a large one. A task of a job array that
   already runs its ``%P`` tasks (counting those started earlier in the cycle, not those concluded
   in it) waits with reason ``JobArrayTaskLimit``: like an ineligible job it blocks nothing and gets
   no reservation.
   A job a QOS or association limit holds back (``limits.py``: counts of the running jobs, kept
   current as the cycle starts jobs) waits with Slurm's reason (``QOSMaxGRESPerUser``,
   ``AssocGrpGRES``, ...); as in Slurm it too blocks nothing and gets no reservation;
6. with preemption on (``preempt.py``), the first job of a partition that does not fit preempts a
   minimal set of runs it may preempt (``JobPreempted``), if that makes it fit now; a run being
   preempted is concluded (requeued, or PREEMPTED) once its exit is reported, and counts as ending
   at the end of its grace time meanwhile.
7. advance reservations (``reservations.py``): unanswered create/delete requests are answered first; a
   live reservation holds its nodes (or GPUs) from outsiders over its window, and a job that asks for
   one (``--reservation``) is placed only inside it.

The per-node work the state still needs (launches, kills, signals) is derived apart, in ``orders.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from corral.libs.core import preempt, reservations
from corral.libs.core.backfill import INF, Planner
from corral.libs.core.conclude import answer_change, answer_control, conclusion_of
from corral.libs.core.eligibility import Singletons, needs_check, pending_reason
from corral.libs.core.limits import Limits, concluded_runs
from corral.libs.core.placement import free_capacity, give_back, request_of, unavailable_nodes
from corral.libs.core.policy import Policy
from corral.libs.core.priority import queue_order
from corral.libs.core.reasons import MAINTENANCE, PendingReason, text, unavailable
from corral.libs.core.state import Job, State, array_throttle
from corral.libs.core.topology import in_force, switch_deadline
from corral.libs.slurm import hostlist
from corral.schemas import events as ev


@dataclass
class Plan:
    """A cycle's output: decisions to append, and facts for squeue."""

    decisions: list[ev.Event] = field(default_factory=list)  # in the order to append them
    reasons: dict[int, PendingReason] = field(default_factory=dict)  # pending reason by job id
    details: dict[int, str] = field(default_factory=dict)  # what squeue shows after a reason, by job id
    priorities: dict[int, int] = field(default_factory=dict)  # priority of each pending job
    starts: dict[int, float] = field(default_factory=dict)  # planned start of jobs with a reservation
    wake_at: float | None = None  # the earliest future begin time or --switches lapse (plan again then)

    def reason_text(self, job_id: int, default: PendingReason = "Priority") -> str:
        """A pending job's reason as squeue shows it (``default`` for a job this plan has no reason for)."""
        return text(self.reasons.get(job_id, default), self.details.get(job_id, ""))


def plan(state: State, now: float, policy: Policy, epoch: int = 0) -> Plan:
    """Decide what happens next. Deterministic in (state, now, policy, epoch)."""
    out = Plan()
    pending: list[Job] = []
    for job_id in state.active:
        job = state.jobs[job_id]
        if job.state == "RUNNING":
            conclusion = conclusion_of(state, job)
            if conclusion is not None:
                out.decisions.append(conclusion)
        elif job.cancel_by is not None:
            out.decisions.append(ev.JobCancelled(job_id=job.job_id, attempt=-1, by=job.cancel_by, signal=0))
        elif (answer := answer_control(job) or answer_change(job)) is not None:
            out.decisions.append(answer)
        else:
            pending.append(job)
    if state.resv_requests:
        out.decisions.extend(reservations.answer_requests(state, now, policy.default_partition))
    _schedule(state, now, policy, pending, out, epoch)
    return out


def _schedule(state: State, now: float, policy: Policy, pending: list[Job], out: Plan, epoch: int) -> None:
    free = free_capacity(state.nodes)
    for job_id in state.active:
        job = state.jobs[job_id]
        # A run whose exit is concluded in this cycle frees its resources now: the conclusion is
        # appended before any allocation that uses them (and the fold refuses the allocation if not).
        if job.state == "RUNNING" and job.run_exit is not None:
            for alloc in job.allocations:
                give_back(free.get(alloc.node), alloc)
    planner = Planner(free, now, policy.blocks, policy.backfill_resolution_s)
    for job_id in state.active:
        job = state.jobs[job_id]
        if job.state == "RUNNING" and job.run_exit is None and job.start_time is not None:
            run_limit = job.time_limit_s
            end = INF if run_limit is None else job.start_time + run_limit
            planner.running(job.allocations, preempt.expected_end(job, end))
    for orphan in state.orphans:
        planner.running(
            [ev.NodeAllocation(node=orphan.node, gpus=orphan.gpus, cpus=orphan.cpus, mem_mb=orphan.mem_mb)],
            now,
        )
    live = reservations.live(state, now) if state.reservations else []
    reservations.hold(planner, state, live)
    maint = reservations.maint_nodes(live, now)
    window = INF if policy.backfill_window_s is None else float(policy.backfill_window_s)
    depth = {"fifo": 0, "easy": 1, "conservative": None}[policy.backfill]
    blocked: set[str] = set()  # partitions with a job that could not start (FIFO stops there)
    reserved: dict[str, int] = {}
    waiting = _ineligible(state, now, pending, out)
    running = _array_running(state, out)
    draining = preempt.draining_for(state) if policy.preempt.preempt_type != "off" else set()
    # Jobs concluded in this cycle are not preempted in it (nor twice by two preemptors).
    spared = set(_decided_jobs(out.decisions))
    limits = Limits.of(state, policy, concluded_runs(out.decisions))
    for job, value in queue_order(state, now, policy, pending):
        out.priorities[job.job_id] = 0 if job.held else value
        if job.job_id in waiting:
            continue
        throttle = array_throttle(job)
        if throttle and running.get(job.array_job_id, 0) >= throttle:
            out.reasons[job.job_id] = "JobArrayTaskLimit"
            continue
        # A job a QOS or association limit holds back, like an ineligible one, blocks nothing.
        limited = limits.reason(job) if limits is not None else None
        if limited is not None:
            out.reasons[job.job_id] = limited
            continue
        # A job that names (-w) a down or drained node cannot start until it is back: it waits, like an
        # ineligible job, without blocking or reserving for anyone (Slurm's ReqNodeNotAvail).
        missing = unavailable_nodes(state, job)
        if missing:
            out.reasons[job.job_id] = "ReqNodeNotAvail"
            out.details[job.job_id] = unavailable(hostlist.compress(missing))
            continue
        partition = policy.partition_of(job)
        if depth == 0 and partition in blocked and job.spec.reservation is None:
            out.reasons[job.job_id] = "Priority"
            continue
        req = in_force(request_of(job), job, now, policy.max_switch_wait_s)
        limit_s = policy.time_limit(job)
        limit = INF if limit_s is None else planner.span(float(limit_s))
        if job.spec.reservation is not None:
            allocation, why = reservations.start_member(planner, state, job, partition, req, limit, now)
            resv = state.reservations.get(job.spec.reservation)
            if why == "Reservation" and resv is not None and resv.start_time > now:
                out.wake_at = resv.start_time if out.wake_at is None else min(out.wake_at, resv.start_time)
        else:
            allocation, why = planner.start_now(partition, req, limit), None
        if allocation is not None:
            out.decisions.append(
                ev.JobAllocated(
                    job_id=job.job_id,
                    attempt=job.restart_count,
                    partition=partition,
                    allocations=allocation,
                    time_limit_s=limit_s,
                    epoch=epoch,
                )
            )
            if job.array_job_id:
                running[job.array_job_id] = running.get(job.array_job_id, 0) + 1
            if limits is not None:
                limits.started(job, allocation)
            continue
        if job.spec.reservation is not None:
            out.reasons[job.job_id] = why or "Resources"  # inside its reservation: it blocks nobody outside
            continue
        top = partition not in blocked
        out.reasons[job.job_id] = "Resources" if top else "Priority"
        if maint and top and any(n in maint for n in planner.nodes_of(partition)):
            out.reasons[job.job_id] = "ReqNodeNotAvail"
            out.details[job.job_id] = MAINTENANCE
        if req.switches is not None:
            _wake(out, switch_deadline(job, policy.max_switch_wait_s))  # plan again when --switches lapses
        blocked.add(partition)
        if top and policy.preempt.preempt_type != "off" and job.job_id not in draining:
            victims = preempt.preempt_for(
                state, policy, job, req, (n.free for n in planner.members(partition)), spared, epoch
            )
            if victims:
                # Its reservation comes once these decisions are folded (the victims' ends are then known).
                out.decisions.extend(victims)
                spared.update(v.job_id for v in victims)
                reserved[partition] = reserved.get(partition, 0) + 1
                continue
        if depth is not None and reserved.get(partition, 0) >= depth:
            continue
        reserved[partition] = reserved.get(partition, 0) + 1
        start = planner.reserve(partition, req, limit, window)
        if start is not None:
            out.starts[job.job_id] = start


def _decided_jobs(decisions: list[ev.Event]) -> Iterator[int]:
    """Ids of the jobs a cycle's decisions are about (reservation decisions are about none)."""
    for decision in decisions:
        if not isinstance(decision, ev.NodeEvent | ev.ReservationEvent):
            yield decision.job_id


def _array_running(state: State, out: Plan) -> dict[int, int]:
    """Running tasks of each job array once this cycle's conclusions (already in ``out``) are applied."""
    running = dict(state.array_running)
    if not running:
        return running
    for job_id in _decided_jobs(out.decisions):
        job = state.jobs[job_id]
        if job.state == "RUNNING" and job.array_job_id in running:
            running[job.array_job_id] -= 1
    return running


def _ineligible(state: State, now: float, pending: list[Job], out: Plan) -> set[int]:
    """Ids of the pending jobs that may not start now; records their reasons and the next begin time."""
    singletons = Singletons(state)
    waiting: set[int] = set()
    for job in pending:
        if not needs_check(job):
            continue
        begin = job.spec.begin_time
        if begin is not None and begin > now:
            _wake(out, begin)
        reason = pending_reason(state, job, now, singletons)
        if reason is not None:
            out.reasons[job.job_id] = reason
            waiting.add(job.job_id)
    return waiting


def _wake(out: Plan, when: float | None) -> None:
    """Ask the shell to plan again at ``when`` (the earliest such time wins)."""
    if when is not None and (out.wake_at is None or when < out.wake_at):
        out.wake_at = when
