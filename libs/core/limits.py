"""QOS and association limits in the scheduling cycle (pure): which pending job a limit holds back, and why.

``Limits.of(state, policy, concluded)`` counts the RUNNING jobs and their GPUs (runs concluded in this
cycle no longer count) in every scope a limit applies to:

- per (QOS, user): MaxTRESPerUser=gres/gpu → ``QOSMaxGRESPerUser``, MaxJobsPerUser →
  ``QOSMaxJobsPerUserLimit``;
- per QOS: GrpTRES=gres/gpu → ``QOSGrpGRES``;
- per (account, user), the user's association: MaxJobs → ``AssocMaxJobsLimit``, its GPU limit →
  ``AssocGrpGRES`` (Slurm has no per-user association reason: a user association's limit is its GrpTRES);
- per account, counting the jobs of the account and of every account below it: GrpJobs →
  ``AssocGrpJobsLimit``, GrpTRES=gres/gpu → ``AssocGrpGRES``.

``reason(job)`` is the first limit the job would exceed if it started now (QOS before association,
as in Slurm), or None; ``started(job, allocation)`` counts a job the cycle starts, so two jobs of a user
placed in one cycle cannot both slip under a limit. A job of a QOS that is not configured waits with
``InvalidQOS``. Submit-time limits (MaxSubmitJobs, MaxWall, a job larger than a limit could ever allow)
are the gateway's: such a job is never accepted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from corral.libs.core.qos import QosPolicy
from corral.libs.core.reasons import PendingReason
from corral.libs.core.state import Job, State
from corral.schemas import events as ev

if TYPE_CHECKING:
    from corral.libs.core.policy import Policy

#: A scope a limit counts in: ("qos-user", qos, user), ("qos", qos), ("assoc", account),
#: ("assoc-user", account, user).
Scope = tuple[str, ...]


def qos_name(policy: Policy, job: Job) -> str:
    """The name of the job's QOS: its own (``--qos``), else its partition's QOS, else the default QOS."""
    if job.spec.qos:
        return job.spec.qos
    part = policy.by_name.get(policy.partition_of(job))
    if part is not None and part.qos:
        return part.qos
    return policy.default_qos


def qos_of(policy: Policy, job: Job) -> QosPolicy:
    """The job's QOS (priority, limits, preemption settings); a QOS no longer configured has none of them."""
    name = qos_name(policy, job)
    return policy.qos_by_name.get(name) or QosPolicy(name)


def requested_gpus(job: Job) -> int:
    """GPUs the job asks for on all its nodes."""
    return job.spec.gpus_per_node * job.spec.nodes


def allocated_gpus(allocation: Iterable[ev.NodeAllocation]) -> int:
    """GPUs a run holds on all its nodes."""
    return sum(len(a.gpus) for a in allocation)


class Limits:
    """Running jobs and GPUs per limit scope, kept current as the cycle starts jobs."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.jobs: Counter[Scope] = Counter()  # running jobs per scope
        self.gpus: Counter[Scope] = Counter()  # GPUs of running jobs per scope

    @classmethod
    def of(cls, state: State, policy: Policy, concluded: set[int]) -> Limits | None:
        """The counts of the running jobs, except ``concluded``; None when no limit is configured."""
        if not policy.limits_running:
            return None
        limits = cls(policy)
        for job_id in state.active:
            job = state.jobs[job_id]
            if job.state == "RUNNING" and job_id not in concluded:
                limits.started(job, job.allocations)
        return limits

    def _scopes(self, job: Job) -> list[Scope]:
        qos = qos_name(self.policy, job)
        account = job.spec.account or job.user
        scopes: list[Scope] = [("qos-user", qos, job.user), ("qos", qos), ("assoc-user", account, job.user)]
        scopes += [("assoc", name) for name in self.policy.account_chain(account)]
        return scopes

    def started(self, job: Job, allocation: Iterable[ev.NodeAllocation]) -> None:
        """Count a running job (or one this cycle starts) with the GPUs of its allocation."""
        gpus = allocated_gpus(allocation)
        for scope in self._scopes(job):
            self.jobs[scope] += 1
            self.gpus[scope] += gpus

    def _over(self, scope: Scope, gpus: int, gpu_limit: int | None, job_limit: int | None) -> str:
        """Which of a scope's limits one more job with ``gpus`` GPUs exceeds: "gres", "jobs" or ""."""
        if gpu_limit is not None and gpus > 0 and self.gpus[scope] + gpus > gpu_limit:
            return "gres"
        if job_limit is not None and self.jobs[scope] + 1 > job_limit:
            return "jobs"
        return ""

    def reason(self, job: Job) -> PendingReason | None:
        """Slurm's reason code of the first limit the job would exceed by starting now, or None."""
        name = qos_name(self.policy, job)
        qos = self.policy.qos_by_name.get(name)
        if qos is None:
            return "InvalidQOS"
        gpus = requested_gpus(job)
        over = self._over(("qos-user", name, job.user), gpus, qos.max_gres_per_user, qos.max_jobs_per_user)
        if over:
            return "QOSMaxGRESPerUser" if over == "gres" else "QOSMaxJobsPerUserLimit"
        if self._over(("qos", name), gpus, qos.grp_gres, None):
            return "QOSGrpGRES"
        account = job.spec.account or job.user
        own = self.policy.limits_by_account.get(account)
        if own is not None:
            scope = ("assoc-user", account, job.user)
            over = self._over(scope, gpus, own.max_gres_per_user, own.max_jobs_per_user)
            if over:
                return "AssocGrpGRES" if over == "gres" else "AssocMaxJobsLimit"
        for name in self.policy.account_chain(account):
            assoc = self.policy.limits_by_account.get(name)
            if assoc is None:
                continue
            over = self._over(("assoc", name), gpus, assoc.grp_gres, assoc.grp_jobs)
            if over:
                return "AssocGrpGRES" if over == "gres" else "AssocGrpJobsLimit"
        return None


def concluded_runs(decisions: Iterable[ev.Event]) -> set[int]:
    """Jobs whose run a cycle's decisions end (their GPUs no longer count against a limit)."""
    ending = ev.JobCompleted | ev.JobFailed | ev.JobCancelled | ev.JobRequeued
    return {d.job_id for d in decisions if isinstance(d, ending)}
