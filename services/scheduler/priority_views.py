"""What ``sprio`` and ``sshare`` see: API views of the queue's priorities and the fair-share tree (pure)."""

from __future__ import annotations

from corral.libs.core.policy import Policy
from corral.libs.core.priority import priority_factors, queue_order
from corral.libs.core.shares import share_rows
from corral.libs.core.state import Job, State
from corral.schemas import api


def _pending(state: State) -> list[Job]:
    """The jobs the next cycle would rank: pending, with no cancel requested."""
    jobs = (state.jobs[job_id] for job_id in state.active)
    return [job for job in jobs if job.state == "PENDING" and job.cancel_by is None]


def priority_reply(state: State, policy: Policy, req: api.PriorityRequest, now: float) -> api.PriorityReply:
    """The pending jobs matching an sprio request, in queue order, with their factors at ``now``.

    The factors are those of the job's computed priority; PRIORITY is what the job is scheduled
    with: 0 while held, the admin-set value when there is one.
    """
    pending = _pending(state)
    parts = priority_factors(state, now, policy, pending)
    wanted = set(req.job_ids)
    rows = []
    for job, value in queue_order(state, now, policy, pending):
        if wanted and job.job_id not in wanted and job.array_job_id not in wanted:
            continue
        if req.users and job.user not in req.users:
            continue
        rows.append(
            api.JobPriority(
                job_id=job.job_id,
                user=job.user,
                account=job.spec.account or job.user,
                partition=policy.partition_of(job),
                priority=0 if job.held else value,
                factors=parts[job.job_id],
                admin_set=job.priority_override is not None,
                array_job_id=job.array_job_id,
                array_task_id=job.array_task_id,
            )
        )
    w = policy.weights
    weights = api.PriorityWeightsInfo(
        age=w.age, fairshare=w.fairshare, job_size=w.job_size, partition=w.partition
    )
    return api.PriorityReply(jobs=rows, weights=weights)


def shares_reply(
    state: State, policy: Policy, req: api.SharesRequest, caller: str, now: float
) -> api.SharesReply:
    """The associations an sshare request asks for: the caller's (or ``-u`` users', or everyone's with
    ``-a``) and the accounts above them, within the ``-A`` accounts (an account and what is beneath
    it); root always. The tree has every user with a job or with usage."""
    users = {job.user for job in state.jobs.values()}
    users |= {key.rpartition("/")[2] for key in state.usage.by_key}
    rows = share_rows(policy, state.usage, now, state.usage_policy.half_life_s, users)
    only = set(req.users) if req.users else (None if req.all_users else {caller})
    path: list[str] = []  # the accounts from root down to the current row's parent
    shown: set[str] = {"root"}
    keep: list[tuple[api.ShareInfo, tuple[str, ...]]] = []
    for row in rows:
        del path[row.depth :]
        lineage = (*path, row.account)  # the row's account and every account above it
        inside = not req.accounts or any(a in req.accounts for a in lineage)
        if row.user:
            if inside and (only is None or row.user in only):
                shown.update(lineage)
                keep.append((row, lineage))
        else:
            if inside and only is None:
                shown.add(row.account)
            keep.append((row, lineage))
            path.append(row.account)
    return api.SharesReply(rows=[row for row, lineage in keep if (row.user or row.account in shown)])
