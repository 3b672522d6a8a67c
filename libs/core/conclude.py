"""What the facts of a job call for: the conclusion of a run, and the answer to a pending job's requests.

Pure, like the rest of the core (``plan.py`` calls ``conclude`` first in every cycle):

- a run whose batch script exited is concluded by how it ended, in this order of precedence: cancelled,
  preempted, requeued on request, lost by its agent, launch error, time limit, OOM, signal, exit code,
  completed;
- a run that lost a node is concluded at once (requeued if the job allows it, else ``NODE_FAIL``);
- a pending job's hold/release request and its update requests get ``JobHeld``/``JobReleased`` and
  ``JobUpdated``.
"""

from __future__ import annotations

from operator import attrgetter

from corral.libs.core import preempt
from corral.libs.core.state import Job, State
from corral.libs.slurm.signals import OOM_SIGNAL
from corral.schemas import events as ev


def conclusion_of(state: State, job: Job, any_down: bool = True) -> ev.Event | None:
    """The conclusion a running job's facts call for, if any (``any_down`` False: every node is up, so
    none of the run's is down)."""
    if job.run_exit is not None:
        return exit_conclusion(job)
    if any_down and any(not state.nodes[a.node].up for a in job.allocations if a.node in state.nodes):
        if job.preempting is not None and job.cancel_by is None:
            return preempt.conclusion(job)
        if job.requeue_by is not None and job.cancel_by is None:
            return requested_requeue(job)
        if job.spec.requeue and job.cancel_by is None:
            return ev.JobRequeued(job_id=job.job_id, attempt=job.restart_count, reason="NodeFail")
        return ev.JobFailed(job_id=job.job_id, attempt=job.restart_count, reason="NodeFail")
    return None


def exit_conclusion(job: Job) -> ev.Event:
    """The conclusion of a run whose batch script exited (``job.run_exit``)."""
    run = job.run_exit
    assert run is not None
    attempt = job.restart_count
    if job.cancel_by is not None:
        return ev.JobCancelled(job_id=job.job_id, attempt=attempt, by=job.cancel_by, signal=run.signal or 15)
    if job.preempting is not None:
        return preempt.conclusion(job)
    if job.requeue_by is not None:
        return requested_requeue(job)
    if run.killed:
        # Killed by its agent without a cancel (the agent restarted and lost it): like a node failure.
        if job.spec.requeue:
            return ev.JobRequeued(job_id=job.job_id, attempt=attempt, reason="NodeFail")
        return ev.JobFailed(job_id=job.job_id, attempt=attempt, reason="NodeFail", signal=run.signal)
    if run.launch_error is not None:
        return ev.JobFailed(
            job_id=job.job_id, attempt=attempt, reason="LaunchFailed", exit_code=1, message=run.launch_error
        )
    if run.timed_out:
        return ev.JobFailed(job_id=job.job_id, attempt=attempt, reason="TimeLimit", signal=run.signal)
    if run.oom:
        # Slurm shows an OOM kill as ExitCode 0:125 whatever the batch shell's own status was.
        return ev.JobFailed(job_id=job.job_id, attempt=attempt, reason="OutOfMemory", signal=OOM_SIGNAL)
    if run.signal:
        return ev.JobFailed(job_id=job.job_id, attempt=attempt, reason="RaisedSignal", signal=run.signal)
    if run.exit_code:
        return ev.JobFailed(
            job_id=job.job_id, attempt=attempt, reason="NonZeroExitCode", exit_code=run.exit_code
        )
    return ev.JobCompleted(job_id=job.job_id, attempt=attempt)


def requested_requeue(job: Job) -> ev.JobRequeued:
    """The conclusion of a run killed on ``scontrol requeue[hold]``."""
    return ev.JobRequeued(
        job_id=job.job_id, attempt=job.restart_count, reason="Requested", hold=job.requeue_hold
    )


def answer_control(job: Job) -> ev.Event | None:
    """The decision a pending job's hold or release request calls for; None if it changes nothing.

    A user's hold is JobHeldUser, an admin's JobHeldAdmin; a user may release only a user hold.
    """
    control = job.control
    if control is None:
        return None
    if control.release:
        if job.held == "user" or (job.held and control.admin):
            return ev.JobReleased(job_id=job.job_id, by=control.user)
        return None
    if not job.held or (control.admin and job.held == "user"):
        return ev.JobHeld(job_id=job.job_id, by=control.user, admin=control.admin)
    return None


def answer_change(job: Job) -> ev.Event | None:
    """The JobUpdated a pending job's update requests call for (the gateway validated them)."""
    change = job.change
    if change is None:
        return None
    spec = job.spec
    return ev.JobUpdated(
        job_id=job.job_id,
        by=change.user,
        time_limit_s=change.time_limit_s if change.time_limit_s is not None else spec.time_limit_s,
        partition=change.partition if change.partition is not None else spec.partition,
        priority=change.priority if change.priority is not None else job.priority_override,
    )


def conclude(state: State, decisions: list[ev.Event]) -> tuple[list[Job], list[Job]]:
    """Step 1 of a cycle (``plan.py``): append to ``decisions`` the conclusions of the runs that ended, the
    cancels and the answers; the jobs left to consider and the running ones (for the cycle's capacity,
    without a second pass over every live job), in log order."""
    pending: list[Job] = []
    running: list[Job] = []
    any_down = not all(map(_up, state.nodes.values()))  # else no run lost a node: one pass, in C
    for job_id in state.active:
        job = state.jobs[job_id]
        if job.state == "RUNNING":
            running.append(job)
            conclusion = conclusion_of(state, job, any_down)
            if conclusion is not None:
                decisions.append(conclusion)
        elif job.cancel_by is not None:
            decisions.append(ev.JobCancelled(job_id=job.job_id, attempt=-1, by=job.cancel_by, signal=0))
        elif job.control is None and job.change is None:
            pending.append(job)  # no request to answer (the common case, without the two calls)
        elif (answer := answer_control(job) or answer_change(job)) is not None:
            decisions.append(answer)
        else:
            pending.append(job)
    return pending, running


#: Whether a node is up (in C).
_up = attrgetter("up")
