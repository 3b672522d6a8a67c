"""Queue order: partition tier, multifactor priority (age, fair share, size), submit time, id."""

from __future__ import annotations

import dataclasses

import pytest
from builders import Log, allocated, cluster, exited, job, policy, submitted

from corral.libs.config.cluster import ConfigError, parse_config
from corral.libs.core.fair_share import Account, UserAssoc
from corral.libs.core.plan import plan
from corral.libs.core.policy import PartitionPolicy
from corral.libs.core.priority import PriorityWeights, queue_order

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
