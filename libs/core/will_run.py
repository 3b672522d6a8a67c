"""When would a job start if it were submitted now? (``sbatch --test-only``, Slurm's will-run test.)

Pure, like ``plan``: the answer is what the next cycle would decide with the hypothetical job in the queue
at its own priority, planned with conservative backfill so that a job behind the top of its partition still
gets a start time: the first ``backfill_depth`` blocked jobs ahead of it in its partition get their
reservations, as in the cycles, and so does the job, however deep it is (``plan``'s ``until``); the jobs
after it are not planned. (Unbounded, one estimate on 10,000 nodes with 100,000 pending jobs would be a
conservative pass of half an hour, the fold held back meanwhile.) The job is planned in a copy of the state
with it added (the job tables copied, everything else shared): the state itself is only read, so the
scheduler can answer in a thread while its loop reads the same state (``QueryVerbs.will_run``), and
nothing is appended.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import msgspec

from corral.libs.core.fold import slim_spec
from corral.libs.core.placement import request_of
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import Policy
from corral.libs.core.state import Job, State
from corral.schemas import events as ev


@dataclass(frozen=True)
class WillRun:
    """The estimate for one hypothetical job."""

    job_id: int  # the id it was planned under (one past the highest id the state knows)
    start: float | None  # when it would start (``now`` if at once); None: not within the backfill window
    nodes: list[str]  # the nodes it would get at once ([] if it would wait: a reservation names no nodes)
    reason: str  # its pending reason when it would not start at once ("" if it would)
    cpus: int  # the CPUs it would be allocated (at once: its allocation's; else what it asks for)


def will_run(state: State, now: float, policy: Policy, user: str, spec: ev.JobSpec) -> WillRun:
    """Plan the state with the job added as submitted by ``user`` at ``now``; the state is left as it was."""
    job_id = max(state.jobs, default=0) + 1
    job = Job(
        job_id=job_id, user=user, spec=slim_spec(spec), submit_time=now, held="user" if spec.held else ""
    )
    hypothetical = msgspec.structs.replace(
        state, jobs={**state.jobs, job_id: job}, active={**state.active, job_id: True}
    )
    # The caller may pass a conservative policy it keeps (its cached properties survive the call).
    conservative = policy if policy.backfill == "conservative" else replace(policy, backfill="conservative")
    return _estimate(plan(hypothetical, now, conservative, until=job_id), job, now)


def _estimate(outlook: Plan, job: Job, now: float) -> WillRun:
    for decision in outlook.decisions:
        if isinstance(decision, ev.JobAllocated) and decision.job_id == job.job_id:
            cpus = sum(a.cpus for a in decision.allocations)
            return WillRun(job.job_id, now, [a.node for a in decision.allocations], "", cpus)
    req = request_of(job)  # what the placement would take: CPUs per node times nodes
    asked = req.cpus * req.nodes
    reason = outlook.reason_text(job.job_id, "Resources")
    return WillRun(job.job_id, outlook.starts.get(job.job_id), [], reason, asked)
