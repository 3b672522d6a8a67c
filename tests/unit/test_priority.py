"""Queue order: partition tier, multifactor priority (age, fair share, size), submit time, id."""

from __future__ import annotations

import dataclasses
import random

import pytest
from builders import Log, allocated, cluster, env, exited, job, policy, registered, submitted

from corral.libs.config.cluster import ConfigError, parse_config
from corral.libs.core.fair_share import Account, UserAssoc
from corral.libs.core.job_facts import FactsCache
from corral.libs.core.plan import plan
from corral.libs.core.policy import PartitionPolicy
from corral.libs.core.priority import PriorityWeights, priority_factors, queue_order, total
from corral.schemas import events as ev

pytestmark = pytest.mark.unit


def test_a_finished_run_is_billed_in_gpu_seconds_to_its_association() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=2, nodes=1, account="ml"), user="alice"))
    log.add(allocated(1, {"gpu01": [0, 1]}))
    start = log.state.jobs[1].start_time or 0.0
    log.add(exited(1, "gpu01"), step=100.0)
    for decision in plan(log.state, log.state.now, policy()).decisions:
        log.add(decision, step=0.0)
    assert log.state.jobs[1].state == "COMPLETED"
    assert log.state.usage.by_key["ml/alice"].value == pytest.approx(2 * (log.state.now - start))


def order(log: Log, pol: object) -> list[int]:
    pending = [j for j in log.state.jobs.values() if j.state == "PENDING"]
    return [j.job_id for j, _ in queue_order(log.state, log.state.now, pol, pending)]  # type: ignore[arg-type]


def test_fair_share_puts_the_user_who_used_less_first() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1), user="alice"))
    log.add(allocated(1, {"gpu01": list(range(8))}))
    log.add(exited(1, "gpu01"), step=3600.0)
    fair = dataclasses.replace(policy(), weights=PriorityWeights(fairshare=10_000))
    for decision in plan(log.state, log.state.now, fair).decisions:
        log.add(decision, step=0.0)
    # Alice submits first, but she has used the cluster for an hour and bob has not.
    log.add(submitted(2, job(gpus=1, nodes=1), user="alice"), submitted(3, job(gpus=1, nodes=1), user="bob"))
    assert order(log, policy()) == [2, 3]  # no fair-share weight: submit order
    assert order(log, fair) == [3, 2]


def test_accounts_share_the_tree() -> None:
    """An over-served account's users rank below the other account's, whatever their own usage."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, account="vision"), user="carol"))
    log.add(allocated(1, {"gpu01": list(range(8))}))
    log.add(exited(1, "gpu01"), step=600.0)
    pol = dataclasses.replace(
        policy(),
        accounts=(Account("vision", "root", 1), Account("nlp", "root", 1)),
        associations=(UserAssoc("carol", "vision"), UserAssoc("dave", "vision"), UserAssoc("erin", "nlp")),
        weights=PriorityWeights(fairshare=1000),
    )
    for decision in plan(log.state, log.state.now, pol).decisions:
        log.add(decision, step=0.0)
    log.add(
        submitted(2, job(gpus=1, nodes=1, account="vision"), user="dave"),  # never ran, but vision did
        submitted(3, job(gpus=1, nodes=1, account="nlp"), user="erin"),
    )
    assert order(log, pol) == [3, 2]


def test_age_and_partition_tier() -> None:
    log = Log(*cluster(nodes=1, gpus=8, partitions=("gpu", "urgent")))
    log.add(submitted(1, job(gpus=1, nodes=1)), submitted(2, job(gpus=1, nodes=1, partition="urgent")))
    tiers = dataclasses.replace(
        policy(),
        partitions=(
            PartitionPolicy("gpu", True, None, None, 1),
            PartitionPolicy("urgent", False, None, None, 5),
        ),
    )
    assert order(log, policy()) == [1, 2]
    assert order(log, tiers) == [2, 1]  # the higher tier is considered first


def test_accounts_in_the_config() -> None:
    config = parse_config(
        '[[accounts]]\nname = "ml"\nshares = 60\nusers = ["alice", "bob"]\n'
        '[[accounts]]\nname = "cv"\nparent = "ml"\nusers = ["carol"]\n'
        '[[nodes]]\nnames = "n1"\ncpus = 4\n'
    )
    assert config.default_account("alice") == "ml"
    assert config.default_account("zed") == "zed"  # not listed: their own account
    assert config.may_use("carol", "cv") and not config.may_use("alice", "cv")
    assert config.may_use("zed", "zed") and not config.may_use("zed", "ml")
    assert config.accounts_of("alice") == ["ml"] and config.accounts_of("zed") == ["zed"]
    # Without [[accounts]] every user is their own account, and the only one they may use (as in Slurm,
    # where an account that has no association is refused).
    alone = parse_config('[[nodes]]\nnames = "n1"\ncpus = 4\n')
    assert alone.may_use("anyone", "anyone") and not alone.may_use("anyone", "anything")
    with pytest.raises(ConfigError, match=r"accounts: .*parent"):
        parse_config('[[accounts]]\nname = "cv"\nparent = "nosuch"\n[[nodes]]\nnames = "n1"\ncpus = 4\n')


def test_priorities_kept_across_cycles_are_those_computed_afresh() -> None:
    # The scheduler keeps each pending job's factors that do not move with time or usage (JOBSIZE,
    # PARTITION, QOS, NICE: ``priority.Steady``) from one cycle to the next in its ``FactsCache``, and
    # computes AGE and FAIRSHARE anew. Through submissions, runs that end (usage), a node that joins (the
    # cluster's size: JOBSIZE), a spec the fold replaces (scontrol update) and a new policy, every cycle's
    # order and priorities equal those computed from nothing, and sprio's factors add up to them.
    rng = random.Random(7)
    pol = dataclasses.replace(
        policy(),
        partitions=(
            PartitionPolicy("gpu", True, None, None, 3),
            PartitionPolicy("low", False, None, None, 1),
        ),
        weights=PriorityWeights(age=1000, fairshare=10_000, job_size=2000, partition=500, max_age_s=600.0),
        accounts=(Account("ml", "root", 2), Account("cv", "root", 1)),
        associations=(UserAssoc("alice", "ml"), UserAssoc("bob", "cv"), UserAssoc("carol", "ml")),
    )
    log = Log(*cluster(nodes=3, gpus=8, partitions=("gpu", "low")))
    facts = FactsCache()
    job_id = 0
    for step in range(40):
        for _ in range(rng.randint(0, 6)):
            job_id += 1
            spec = job(
                gpus=rng.choice([1, 2, 4, 8]),
                nodes=rng.choice([1, 1, 2]),
                account=rng.choice([None, "ml", "cv"]),
                nice=rng.choice([0, 0, 50]),
                time_s=rng.choice([60, 600, 3600]),
            )
            log.add(submitted(job_id, spec, user=rng.choice(["alice", "bob", "carol", "dave"])), step=7.0)
        running = [j for j in log.state.jobs.values() if j.state == "RUNNING"]
        for run in rng.sample(running, k=min(len(running), rng.randint(0, 2))):
            log.add(*(exited(run.job_id, a.node) for a in run.allocations), step=30.0)
        pending = [j for j in log.state.jobs.values() if j.state == "PENDING"]
        if pending and step % 5 == 2:  # a spec replaced: its partition and time limit updated
            updated = rng.choice(pending)
            log.add(ev.JobUpdated(job_id=updated.job_id, by="root", time_limit_s=120, partition="low"))
        if step == 20:
            # The cluster grows: every job's JOBSIZE moves.
            log.add(registered("gpu09", gpus=8, partitions=("gpu", "low")))
        if step == 30:
            pol = dataclasses.replace(pol, weights=dataclasses.replace(pol.weights, job_size=3000))
        now = log.state.now
        pending = [j for j in log.state.jobs.values() if j.state == "PENDING"]
        kept = queue_order(log.state, now, pol, pending, facts)
        assert kept == queue_order(log.state, now, pol, pending), step
        shown = priority_factors(log.state, now, pol, pending)
        assert all(value == total(shown[j.job_id]) for j, value in kept if j.priority_override is None)
        for decision in plan(log.state, now, pol, cache=None).decisions:
            log.add(decision, step=0.0)
    assert job_id > 80 and len(facts._facts) > 20


@pytest.mark.parametrize("seed", range(6))
def test_with_equal_priorities_the_queue_is_in_submit_time_then_id_order(seed: int) -> None:
    # With every weight 0, no --nice and one tier, every job's priority is 1 and the order is its submit
    # time, then its id (the ids need not follow the times: several gateways, clocks a little apart); an
    # admin-set priority on one job ranks it by that value first.
    rng = random.Random(seed)
    log = Log(*cluster(nodes=1, gpus=8))
    ids = rng.sample(range(1, 200), 40)
    for job_id in ids:
        log.append(env(submitted(job_id, job(gpus=1)), at=float(rng.choice([10, 11, 12, 13]))))
    pending = [log.state.jobs[i] for i in log.state.active]
    rng.shuffle(pending)
    order = queue_order(log.state, 100.0, policy(), pending)
    assert order == [(j, 1) for j in sorted(pending, key=lambda j: (j.submit_time, j.job_id))]
    boosted = rng.choice(pending)
    log.add(ev.JobUpdated(job_id=boosted.job_id, by="root", time_limit_s=None, partition=None, priority=5))
    order = queue_order(log.state, 100.0, policy(), pending)
    assert order[0] == (boosted, 5)
    rest = sorted((j for j in pending if j is not boosted), key=lambda j: (j.submit_time, j.job_id))
    assert order[1:] == [(j, 1) for j in rest]
