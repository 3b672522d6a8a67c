"""QOS and association limits in the cycle (``libs/core/limits.py``), QOS priority and nice."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
from builders import Log, cluster, exited, job, partition, policy, submitted

from corral.libs.core.fair_share import Account
from corral.libs.core.limits import qos_name
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import PartitionPolicy, Policy
from corral.libs.core.priority import PriorityWeights
from corral.libs.core.qos import AssocLimits, QosPolicy
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

#: root > ml > {vision, nlp}; alice is in vision, bob in nlp.
TREE = (Account("ml", "root", 1), Account("vision", "ml", 1), Account("nlp", "ml", 1))
UNLIMITED = policy()


def limited(*qos: QosPolicy, assoc: tuple[AssocLimits, ...] = (), backfill: str = "easy") -> Policy:
    """The default test policy with these QOS and association limits over TREE."""
    return dataclasses.replace(
        UNLIMITED,
        qos=qos,
        account_limits=assoc,
        accounts=TREE,
        backfill=backfill,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class Case:
    """Running jobs (started without limits), then one pending job planned under ``pol``."""

    pol: Policy  # the policy of the cycle under test
    running: tuple[tuple[str, str, str, int], ...]  # (user, account, qos, GPUs) of each running job
    pending: tuple[str, str, str, int]  # the pending job
    reason: str | None  # its expected reason; None: it starts


def spec(account: str, qos: str, gpus: int) -> ev.JobSpec:
    """One node with ``gpus`` GPUs, charged to ``account`` in ``qos``."""
    return job(gpus=gpus, nodes=1, account=account, qos=qos)


def run(case: Case) -> tuple[Plan, int]:
    """Start the running jobs with no limit, submit the pending one and plan under the case's policy."""
    log = Log(*cluster(nodes=4, gpus=8))
    for i, (user, account, qos, gpus) in enumerate(case.running, start=1):
        log.add(submitted(i, spec(account, qos, gpus), user=user))
    log.add(*plan(log.state, log.at, UNLIMITED).decisions)
    assert all(log.state.jobs[i].state == "RUNNING" for i in range(1, len(case.running) + 1))
    pending = len(case.running) + 1
    user, account, qos, gpus = case.pending
    log.add(submitted(pending, spec(account, qos, gpus), user=user))
    return plan(log.state, log.at, case.pol), pending


CASES = {
    "qos-max-gres-per-user": Case(
        limited(QosPolicy("q", max_gres_per_user=8)),
        (("alice", "vision", "q", 4),),
        ("alice", "vision", "q", 8),
        "QOSMaxGRESPerUser",
    ),
    "qos-max-gres-per-user-other-user": Case(
        limited(QosPolicy("q", max_gres_per_user=8)),
        (("alice", "vision", "q", 8),),
        ("bob", "nlp", "q", 8),
        None,
    ),
    "qos-max-gres-per-user-other-qos": Case(
        limited(QosPolicy("q", max_gres_per_user=8)),
        (("alice", "vision", "q", 8),),
        ("alice", "vision", "normal", 8),
        None,
    ),
    "qos-max-gres-cpu-job": Case(
        limited(QosPolicy("q", max_gres_per_user=8)),
        (("alice", "vision", "q", 8),),
        ("alice", "vision", "q", 0),
        None,
    ),
    "qos-max-jobs-per-user": Case(
        limited(QosPolicy("q", max_jobs_per_user=1)),
        (("alice", "vision", "q", 1),),
        ("alice", "vision", "q", 1),
        "QOSMaxJobsPerUserLimit",
    ),
    "qos-grp-gres": Case(
        limited(QosPolicy("q", grp_gres=8)),
        (("bob", "nlp", "q", 8),),
        ("alice", "vision", "q", 1),
        "QOSGrpGRES",
    ),
    "qos-grp-gres-room": Case(
        limited(QosPolicy("q", grp_gres=8)),
        (("bob", "nlp", "q", 6),),
        ("alice", "vision", "q", 2),
        None,
    ),
    "assoc-grp-gres-parent": Case(
        limited(assoc=(AssocLimits("ml", grp_gres=8),)),
        (("bob", "nlp", "normal", 8),),
        ("alice", "vision", "normal", 2),
        "AssocGrpGRES",
    ),
    "assoc-grp-gres-sibling-limit": Case(
        limited(assoc=(AssocLimits("nlp", grp_gres=8),)),
        (("bob", "nlp", "normal", 8),),
        ("alice", "vision", "normal", 2),
        None,
    ),
    "assoc-grp-jobs": Case(
        limited(assoc=(AssocLimits("ml", grp_jobs=1),)),
        (("bob", "nlp", "normal", 1),),
        ("alice", "vision", "normal", 1),
        "AssocGrpJobsLimit",
    ),
    "assoc-max-jobs-per-user": Case(
        limited(assoc=(AssocLimits("vision", max_jobs_per_user=1),)),
        (("alice", "vision", "normal", 1),),
        ("alice", "vision", "normal", 1),
        "AssocMaxJobsLimit",
    ),
    "assoc-max-jobs-per-user-other-user": Case(
        limited(assoc=(AssocLimits("vision", max_jobs_per_user=1),)),
        (("alice", "vision", "normal", 1),),
        ("carol", "vision", "normal", 1),
        None,
    ),
    "assoc-max-gres-per-user": Case(
        limited(assoc=(AssocLimits("vision", max_gres_per_user=4),)),
        (("alice", "vision", "normal", 4),),
        ("alice", "vision", "normal", 1),
        "AssocGrpGRES",
    ),
    "qos-before-assoc": Case(
        limited(QosPolicy("q", max_jobs_per_user=1), assoc=(AssocLimits("ml", grp_jobs=1),)),
        (("alice", "vision", "q", 1),),
        ("alice", "vision", "q", 1),
        "QOSMaxJobsPerUserLimit",
    ),
    "invalid-qos": Case(
        limited(QosPolicy("q", max_jobs_per_user=1)), (), ("alice", "vision", "gone", 1), "InvalidQOS"
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_limit_reason(case: Case) -> None:
    out, pending = run(case)
    started = {d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)}
    if case.reason is None:
        assert pending in started, out.reasons
    else:
        assert pending not in started
        assert out.reasons[pending] == case.reason
        assert pending not in out.starts  # a limited job gets no reservation


def test_counts_include_the_jobs_the_cycle_starts() -> None:
    """MaxGRESPerUser=8, a user's 4- and 8-GPU jobs in one cycle: the first starts, the second waits."""
    log = Log(*cluster(nodes=4, gpus=8))
    log.add(submitted(1, spec("vision", "q", 4), user="alice"))
    log.add(submitted(2, spec("vision", "q", 8), user="alice"))
    log.add(submitted(3, spec("nlp", "q", 8), user="bob"))
    out = plan(log.state, log.at, limited(QosPolicy("q", max_gres_per_user=8)))
    started = [d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)]
    assert started == [1, 3]  # the limited job blocked nothing behind it
    assert out.reasons == {2: "QOSMaxGRESPerUser"}


def test_limited_job_does_not_block_a_fifo_partition() -> None:
    log = Log(*cluster(nodes=2, gpus=8))
    log.add(submitted(1, spec("vision", "q", 8), user="alice"))
    log.add(*plan(log.state, log.at, UNLIMITED).decisions)
    log.add(submitted(2, spec("vision", "q", 8), user="alice"))
    log.add(submitted(3, spec("nlp", "q", 8), user="bob"))
    out = plan(log.state, log.at, limited(QosPolicy("q", max_jobs_per_user=1), backfill="fifo"))
    assert [d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)] == [3]
    assert out.reasons == {2: "QOSMaxJobsPerUserLimit"}


def test_a_run_concluded_in_the_cycle_no_longer_counts() -> None:
    log = Log(*cluster(nodes=2, gpus=8))
    log.add(submitted(1, spec("vision", "q", 8), user="alice"))
    log.add(*plan(log.state, log.at, UNLIMITED).decisions)
    log.add(submitted(2, spec("vision", "q", 8), user="alice"))
    pol = limited(QosPolicy("q", max_gres_per_user=8))
    assert plan(log.state, log.at, pol).reasons == {2: "QOSMaxGRESPerUser"}
    node = log.state.jobs[1].allocations[0].node
    log.add(ev.RunStarted(job_id=1, attempt=0, node=node, pid=10), exited(1, node))
    out = plan(log.state, log.at, pol)
    assert [type(d).__name__ for d in out.decisions] == ["JobCompleted", "JobAllocated"]
    assert out.reasons == {}


def _order(out: Plan) -> list[int]:
    return [d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)]


def test_qos_priority_orders_the_queue() -> None:
    """Higher-QOS jobs go first when PriorityWeightQOS counts; the factor is relative to the top QOS."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, spec("vision", "low", 8)))
    log.add(submitted(2, spec("vision", "normal", 8)))
    log.add(submitted(3, spec("vision", "high", 8)))
    qos = (QosPolicy("low", priority=0), QosPolicy("high", priority=10), QosPolicy("normal", priority=5))
    pol = dataclasses.replace(UNLIMITED, qos=qos, weights=PriorityWeights(qos=1000))
    out = plan(log.state, log.at, pol)
    assert _order(out) == [3]
    assert out.priorities == {1: 1, 2: 500, 3: 1000}
    assert out.reasons == {1: "Priority", 2: "Resources"}
    # Without the weight the QOS does not matter: submit order.
    assert _order(plan(log.state, log.at, UNLIMITED)) == [1]


NICE = {
    "nice-lowers": ((100, 0), [2], {1: 900, 2: 1000}),
    "negative-nice-raises": ((-500, 0), [1], {1: 1500, 2: 1000}),
    "floor-of-one": ((5000, 0), [2], {1: 1, 2: 1000}),
}


@pytest.mark.parametrize(("nices", "first", "priorities"), NICE.values(), ids=NICE.keys())
def test_nice_is_subtracted(nices: tuple[int, int], first: list[int], priorities: dict[int, int]) -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    for job_id, nice in enumerate(nices, start=1):
        log.add(submitted(job_id, job(gpus=8, nodes=1, nice=nice)))
    pol = dataclasses.replace(UNLIMITED, weights=PriorityWeights(partition=1000))
    out = plan(log.state, log.at, pol)
    assert _order(out) == first
    assert out.priorities == priorities


def test_nice_without_weights_keeps_submit_order_but_is_not_the_fast_path() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, nice=100)))
    log.add(submitted(2, job(gpus=8, nodes=1)))
    out = plan(log.state, log.at, UNLIMITED)
    assert _order(out) == [1] and out.priorities == {1: 1, 2: 1}


QOS_NAMES = {
    "own": (job(nodes=1, qos="high", partition="p"), "high"),
    "partition": (job(nodes=1, partition="p"), "part-qos"),
    "default": (job(nodes=1, partition="other"), "normal"),
}


@pytest.mark.parametrize(("spec_", "name"), QOS_NAMES.values(), ids=QOS_NAMES.keys())
def test_qos_name(spec_: ev.JobSpec, name: str) -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, spec_))
    pol = policy(
        dataclasses.replace(partition("p"), qos="part-qos"), PartitionPolicy("other", False, None, None)
    )
    assert qos_name(pol, log.state.jobs[1]) == name


TIME_LIMITS = {
    "maxwall-caps-default": (None, 7200, 3600),
    "own-limit-kept": (600, 7200, 600),
    "unlimited-partition": (None, None, 3600),
    "under-maxwall": (None, 1800, 1800),
}


@pytest.mark.parametrize(("own", "part_default", "limit"), TIME_LIMITS.values(), ids=TIME_LIMITS.keys())
def test_time_limit_capped_at_maxwall(own: int | None, part_default: int | None, limit: int) -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, qos="short", time_s=own)))
    pol = dataclasses.replace(
        policy(partition(default_s=part_default)), qos=(QosPolicy("short", max_wall_s=3600),)
    )
    assert pol.time_limit(log.state.jobs[1]) == limit
