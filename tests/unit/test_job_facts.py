"""``FactsCache``: a pending job's spec-only answers kept across cycles are computed again when the job's spec
changes (``scontrol update``) or the policy is another one, so plans with the cache equal plans without."""

from __future__ import annotations

import dataclasses

from builders import Log, cluster, job, partition, policy, submitted

from corral.libs.core.capacity import CapacityCache
from corral.libs.core.job_facts import FactsCache, facts_of
from corral.libs.core.plan import plan
from corral.schemas import events as ev


def test_an_updated_spec_or_another_policy_gives_new_facts() -> None:
    pol = policy(partition("gpu", max_s=3600), partition("cpu", default=False))
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=7200)))
    cache = FactsCache()
    first = cache.of(log.state.jobs[1], pol)
    assert first.over_partition == "PartitionTimeLimit"
    assert cache.of(log.state.jobs[1], pol) is first
    log.add(ev.JobUpdateRequested(job_id=1, user="root", admin=True, time_limit_s=600, partition="cpu"))
    log.decide(plan(log.state, log.at, pol).decisions)  # JobUpdated: the fold replaces the spec
    updated = cache.of(log.state.jobs[1], pol)
    assert (updated.partition, updated.over_partition) == ("cpu", None)
    other = dataclasses.replace(pol, default_qos="other")
    assert cache.of(log.state.jobs[1], other) is not updated
    assert cache.of(log.state.jobs[1], other) == facts_of(log.state.jobs[1], other)
    assert updated.placed(log.state.jobs[1], pol)[1].nodes == 1 and updated.limit_s == 600


def test_plans_with_kept_facts_follow_an_update() -> None:
    """A job over its partition's MaxTime waits; once updated under it, the cached cycle starts it too."""
    pol = policy(partition("gpu", max_s=3600))
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=7200)))
    cache = CapacityCache()
    waiting = plan(log.state, log.at, pol, cache=cache)
    assert waiting == plan(log.state, log.at, pol) and waiting.reasons == {1: "PartitionTimeLimit"}
    log.add(ev.JobUpdateRequested(job_id=1, user="root", admin=True, time_limit_s=600))
    log.decide(plan(log.state, log.at, pol, cache=cache).decisions)
    started = plan(log.state, log.at, pol, cache=cache)
    assert started == plan(log.state, log.at, pol)
    assert [type(d) for d in started.decisions] == [ev.JobAllocated]
