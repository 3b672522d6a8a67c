"""What ``sprio`` and ``sshare`` see: API views of the queue's priorities and the fair-share tree (pure)."""

from __future__ import annotations

from operator import attrgetter

from corral.libs.core.policy import Policy
from corral.libs.core.priority import Ranking, value, weighted
from corral.libs.core.shares import share_rows
from corral.libs.core.state import Job, State
from corral.schemas import api
from corral.schemas.codec import MAX_REPLY_BYTES, page

_job_id = attrgetter("job_id")


def _pending(state: State) -> list[Job]:
    """The jobs the next cycle would rank: pending, with no cancel requested."""
    jobs = (state.jobs[job_id] for job_id in state.active)
    return [job for job in jobs if job.state == "PENDING" and job.cancel_by is None]


def priority_reply(state: State, policy: Policy, req: api.PriorityRequest, now: float) -> api.PriorityReply:
    """The pending jobs matching an sprio request with their factors at ``now``: by id, from
    ``req.after_job_id`` on, as many as ``MAX_REPLY_BYTES`` hold (``more`` if some are left), each with what
    orders the queue (``JobPriority.queue_key``).

    The factors are those of the job's computed priority; PRIORITY is what the job is scheduled
    with: 0 while held, the admin-set value when there is one.
    """
    # The fair-share tree is that of every pending job's users, whatever the page; the factors are computed
    # for the page's rows only (every pending job's, for each page, took 2.3 s for 50,000 jobs).
    pending = _pending(state)
    ranking = Ranking(state, now, policy, pending)
    computed = weighted(policy, pending)
    tiers = {p.name: p.tier for p in policy.partitions}
    wanted = set(req.job_ids)
    users = set(req.users)
    after = req.after_job_id
    shown = [
        job
        for job in pending
        if job.job_id > after
        and (not wanted or job.job_id in wanted or job.array_job_id in wanted)
        and (not users or job.user in users)
    ]
    shown.sort(key=_job_id)
    rows = (
        api.JobPriority(
            job_id=job.job_id,
            user=job.user,
            account=job.spec.account or job.user,
            partition=partition,
            priority=0 if job.held else ranked,
            factors=factors,
            admin_set=job.priority_override is not None,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            tier=tiers.get(partition, 1),
            queue_priority=ranked,
            submit_time=job.submit_time,
        )
        for job in shown
        for partition, factors in ((policy.partition_of(job), ranking.factors(job)),)
        for ranked in (value(job, factors, computed),)
    )
    out, more = page(rows, MAX_REPLY_BYTES)
    w = policy.weights
    weights = api.PriorityWeightsInfo(
        age=w.age, fairshare=w.fairshare, job_size=w.job_size, partition=w.partition
    )
    return api.PriorityReply(jobs=out, weights=weights, more=more)


def shares_reply(
    state: State, policy: Policy, req: api.SharesRequest, caller: str, now: float
) -> api.SharesReply:
    """The associations an sshare request asks for: the caller's (or ``-u`` users', or everyone's with
    ``-a``) and the accounts above them, within the ``-A`` accounts (an account and what is beneath
    it); root always. The tree has every user with a job or with usage. From the ``req.start``-th row on,
    as many as ``MAX_REPLY_BYTES`` hold (``more`` if some are left)."""
    users = {job.user for job in state.jobs.values()}
    users |= {key.rpartition("/")[2] for key in state.usage.by_key}
    only = set(req.users) if req.users else (None if req.all_users else {caller})
    half_life = state.usage_policy.half_life_s
    rows = share_rows(policy, state.usage, now, half_life, users, only, set(req.accounts), req.start)
    out, more = page(rows, MAX_REPLY_BYTES)
    return api.SharesReply(rows=out, more=more)
