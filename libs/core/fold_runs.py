"""The fold's run events (``fold.py`` dispatches them here): allocation, run facts, conclusions, preemption.

Each handler checks before it changes: a decision that would give a GPU index to two runs, start a held,
throttled or cancelled job, or that names a stale attempt, changes nothing, and the handler returns why
(``outcome.IgnoreReason``); a stale leader epoch is fenced before any handler (``fold.apply``). The states
each event may move a job between are ``schemas.lifecycle``'s tables.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.libs.core import retention
from corral.libs.core.causation import ALLOCATED
from corral.libs.core.fair_share import billing, charge, user_key
from corral.libs.core.fold_nodes import drop_orphans, runs_on
from corral.libs.core.outcome import APPLIED, Outcome, ignored
from corral.libs.core.state import Job, Node, Orphan, Preemption, RunExit, State, array_throttle
from corral.schemas import events as ev
from corral.schemas import lifecycle
from corral.schemas.lifecycle import JobState


def job_for(state: State, seq: int, job_id: int) -> Job | None:
    """The job an entry on its subject is about (its ``last_seq`` moves to ``seq``), None if unknown."""
    job = state.jobs.get(job_id)
    if job is not None:
        job.last_seq = seq
    return job


def _fits(node: Node, alloc: ev.NodeAllocation) -> bool:
    if not node.up or any(g in node.used_gpus or not 0 <= g < node.gpus for g in alloc.gpus):
        return False
    return node.alloc_cpus + alloc.cpus <= node.cpus and node.alloc_mem_mb + alloc.mem_mb <= node.mem_mb


def _allocation_problem(state: State, job: Job, body: ev.JobAllocated) -> Outcome | None:
    """Why the allocation cannot apply to ``job``, or None if it can."""
    if job.state != "PENDING":
        return ignored("wrong_state")
    if body.attempt != job.restart_count:
        return ignored("stale_attempt")
    if job.cancel_by is not None:
        return ignored("cancel_requested")
    if job.held:
        return ignored("held")
    if _throttled(state, job):
        return ignored("throttled")
    distinct_nodes = len({a.node for a in body.allocations}) == len(body.allocations)
    if (
        not body.allocations
        or not distinct_nodes
        or any(len(set(a.gpus)) != len(a.gpus) for a in body.allocations)
    ):
        return ignored("bad_allocation")
    for alloc in body.allocations:
        node = state.nodes.get(alloc.node)
        if node is None:
            return ignored("unknown_node")
        if not _fits(node, alloc):
            return ignored("no_room")
    return None


def _allocated(state: State, seq: int, at: float, body: ev.JobAllocated) -> Outcome:
    job = job_for(state, seq, body.job_id)
    if job is None:
        return ignored("unknown_job")
    problem = _allocation_problem(state, job, body)
    if problem is not None:
        return problem
    for alloc in body.allocations:
        node = state.nodes[alloc.node]
        node.used_gpus = sorted(node.used_gpus + list(alloc.gpus))
        node.alloc_cpus += alloc.cpus
        node.alloc_mem_mb += alloc.mem_mb
        node.jobs.append(job.job_id)
    job.state = "RUNNING"
    if job.array_job_id:
        state.array_running[job.array_job_id] = state.array_running.get(job.array_job_id, 0) + 1
    job.control = job.change = None
    job.partition = body.partition
    job.allocations = list(body.allocations)
    job.time_limit_s = body.time_limit_s
    job.start_time = at
    job.end_time = None
    job.run_started = False
    job.run_exit = None
    job.exited_nodes = ()
    return APPLIED


def _throttled(state: State, job: Job) -> bool:
    """True if starting this array task would run more of its array's tasks at once than ``%P``."""
    limit = array_throttle(job)
    return limit > 0 and state.array_running.get(job.array_job_id, 0) >= limit


def _stopped_running(state: State, job: Job) -> None:
    """Account for a RUNNING array task that stops running (ends or is requeued)."""
    if not job.array_job_id:
        return
    left = state.array_running.get(job.array_job_id, 0) - 1
    if left > 0:
        state.array_running[job.array_job_id] = left
    else:
        state.array_running.pop(job.array_job_id, None)


def _run_problem(job: Job | None, attempt: int, node: str) -> Outcome | None:
    """Why a run fact is not about ``job``'s current run on its batch node, or None if it is (a fact from
    a node the run is not on at all is ``foreign_node``)."""
    if job is None:
        return ignored("unknown_job")
    if job.state != "RUNNING":
        return ignored("wrong_state")
    if attempt != job.restart_count:
        return ignored("stale_attempt")
    # An agent's role pins the node token of its run facts' subjects, not the job id: agent node1 may
    # publish a start or an exit of any job. Only a node the current run is allocated on speaks for it.
    if not runs_on(job, node):
        return ignored("foreign_node")
    if job.allocations[0].node != node:
        return ignored("not_batch_node")
    return None


def live_run(state: State, job_id: int, attempt: int) -> bool:
    """True if ``attempt`` is the current run of a RUNNING job (the rule for step facts, too)."""
    job = state.jobs.get(job_id)
    return job is not None and job.state == "RUNNING" and job.restart_count == attempt


def _run_started(state: State, seq: int, at: float, body: ev.RunStarted) -> Outcome:
    job = job_for(state, seq, body.job_id)
    problem = _run_problem(job, body.attempt, body.node)
    if problem is not None:
        return problem
    assert job is not None
    job.run_started = True
    return APPLIED


def _run_exited(state: State, seq: int, at: float, body: ev.RunExited) -> Outcome:
    orphans = len(state.orphans)
    drop_orphans(state, lambda o: (o.job_id, o.attempt, o.node) == (body.job_id, body.attempt, body.node))
    job = job_for(state, seq, body.job_id)
    # Any node of the live run: its agent says the run's processes there are gone (its resources are free
    # at the conclusion; the batch node's report is also the run's exit).
    peer_gone = (
        job is not None
        and live_run(state, body.job_id, body.attempt)
        and body.node not in job.exited_nodes
        and runs_on(job, body.node)
    )
    if peer_gone:
        assert job is not None
        job.exited_nodes = [*job.exited_nodes, body.node]
    problem = _run_problem(job, body.attempt, body.node)
    if problem is None and job is not None and job.run_exit is not None:
        problem = ignored("duplicate")
    if problem is not None:
        # The exit of a concluded run (an orphan) still gives its resources back.
        return APPLIED if len(state.orphans) < orphans or peer_gone else problem
    assert job is not None
    job.run_exit = RunExit(
        exit_code=body.exit_code,
        signal=body.signal,
        oom=body.oom,
        timed_out=body.timed_out,
        launch_error=body.launch_error,
        killed=body.killed,
    )
    return APPLIED


def _release(state: State, job: Job) -> None:
    # Slurm's COMPLETING, on every node of the run: processes of the run may live on any of them (the batch
    # script, srun's tasks, what they started), also on a node that is down (its agent died, not its
    # processes). Each node keeps the run's resources until its own agent reports the run's processes there
    # gone (RunExited from that node: on its own, or after a kill order).
    orphaned = set()
    for alloc in job.allocations:
        if alloc.node in job.exited_nodes:
            continue
        orphaned.add(alloc.node)
        state.orphans.append(
            Orphan(
                job_id=job.job_id,
                attempt=job.restart_count,
                node=alloc.node,
                gpus=list(alloc.gpus),
                cpus=alloc.cpus,
                mem_mb=alloc.mem_mb,
                cause=job.causes.get(ALLOCATED, ""),
            )
        )
    for alloc in job.allocations:
        node = state.nodes.get(alloc.node)
        if node is None:
            continue
        node.jobs = [j for j in node.jobs if j != job.job_id]
        if node.name in orphaned:
            continue
        held = set(alloc.gpus)
        node.used_gpus = [g for g in node.used_gpus if g not in held]
        node.alloc_cpus -= alloc.cpus
        node.alloc_mem_mb -= alloc.mem_mb


def _decision_job(state: State, seq: int, job_id: int, attempt: int) -> Job | Outcome:
    """The job a conclusion is about, if it still applies to the job's current attempt; else why not."""
    job = job_for(state, seq, job_id)
    if job is None:
        return ignored("unknown_job")
    if job.state not in lifecycle.LIVE_STATES:
        return ignored("wrong_state")
    if attempt != (job.restart_count if job.state == "RUNNING" else -1):
        return ignored("stale_attempt")
    return job


def _bill(state: State, job: Job, at: float) -> None:
    """Charge a run that ends now to its user's association."""
    if job.start_time is None or not job.allocations:
        return
    policy = state.usage_policy
    amount = billing(
        sum(len(a.gpus) for a in job.allocations),
        sum(a.cpus for a in job.allocations),
        sum(a.mem_mb for a in job.allocations),
        at - job.start_time,
        policy.weights,
    )
    charge(state.usage, user_key(job.user, job.spec.account or job.user), amount, at, policy.half_life_s)


def _end(state: State, job: Job, at: float, final: JobState) -> Outcome:
    if job.state == "RUNNING":
        _bill(state, job, at)
        _release(state, job)
        _stopped_running(state, job)
    state.active.pop(job.job_id, None)
    job.state = final
    job.end_time = at
    _run_over(job)
    retention.job_ended(state, job)
    return APPLIED


def _run_over(job: Job) -> None:
    """Forget what was asked of a run that is over (requeue, signals)."""
    job.requeue_by, job.requeue_hold, job.signals = None, False, ()


def _completed(state: State, seq: int, at: float, body: ev.JobCompleted) -> Outcome:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if isinstance(job, Outcome):
        return job
    return _end(state, job, at, "COMPLETED")


def _failed(state: State, seq: int, at: float, body: ev.JobFailed) -> Outcome:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if isinstance(job, Outcome):
        return job
    job.exit_code, job.signal, job.end_reason = body.exit_code, body.signal, body.reason
    job.end_message = body.message
    return _end(state, job, at, lifecycle.failed_state(body.reason))


def _cancelled(state: State, seq: int, at: float, body: ev.JobCancelled) -> Outcome:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if isinstance(job, Outcome):
        return job
    job.cancel_by = body.by
    job.exit_code, job.signal = 0, body.signal
    return _end(state, job, at, "CANCELLED")


def _requeued(state: State, seq: int, at: float, body: ev.JobRequeued) -> Outcome:
    job = _decision_job(state, seq, body.job_id, body.attempt)
    if isinstance(job, Outcome):
        return job
    if job.state != "RUNNING":
        return ignored("wrong_state")
    _bill(state, job, at)
    _release(state, job)
    _stopped_running(state, job)
    job.state = "PENDING"
    job.restart_count += 1
    job.allocations = ()
    job.start_time = None
    job.run_started = False
    job.run_exit = None
    job.exited_nodes = ()
    job.preempting = None
    _run_over(job)
    if body.hold:
        job.held = "user"
    return APPLIED


def _preempted(state: State, seq: int, at: float, body: ev.JobPreempted) -> Outcome:
    job = job_for(state, seq, body.job_id)
    if job is None:
        return ignored("unknown_job")
    # Only a live run that is not ending already, and only once: a run is never preempted twice.
    if job.state != "RUNNING":
        return ignored("wrong_state")
    if body.attempt != job.restart_count:
        return ignored("stale_attempt")
    if job.preempting is not None or job.run_exit is not None:
        return ignored("duplicate")
    if job.cancel_by is not None:
        return ignored("cancel_requested")
    job.preempting = Preemption(mode=body.mode, grace_s=body.grace_s, at=at, by_job=body.by_job)
    return APPLIED


#: Fold handlers of the run events (merged into ``fold.HANDLERS``).
RUN_HANDLERS: dict[type, Callable[[State, int, float, Any], Outcome]] = {
    ev.JobAllocated: _allocated,
    ev.RunStarted: _run_started,
    ev.RunExited: _run_exited,
    ev.JobCompleted: _completed,
    ev.JobFailed: _failed,
    ev.JobCancelled: _cancelled,
    ev.JobRequeued: _requeued,
    ev.JobPreempted: _preempted,
}
