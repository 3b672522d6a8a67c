"""Preemption with grace: who preempts whom, the victim set, the kill order, the conclusion, the fold."""

from __future__ import annotations

import dataclasses
import re

import msgspec
import pytest
from builders import T0, Log, allocated, cluster, env, exited, job, numbered, semantic, submitted

from corral.libs.config.cluster import ConfigError, parse_config
from corral.libs.core.fold import fold
from corral.libs.core.orders import orders
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import PartitionPolicy, Policy
from corral.libs.core.preempt import PreemptPolicy
from corral.libs.core.state import Preemption, encode_state
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.accounting.projection import convert
from corral.services.scheduler.views import policy_of

pytestmark = pytest.mark.unit

#: Every node is in every partition; tiers: scavenger 0 < low = peer 1 < high 2.
PARTS = ("low", "peer", "high", "scavenger", "pinned")
GRACE = 60.0
POLICY = Policy(
    partitions=(
        PartitionPolicy("low", True, None, None, 1),
        PartitionPolicy("peer", False, None, None, 1),
        PartitionPolicy("high", False, None, None, 2),
        PartitionPolicy("scavenger", False, None, None, 0, preempt_mode="cancel", grace_time_s=30.0),
        PartitionPolicy("pinned", False, None, None, 0, preempt_mode="off"),
    ),
    cluster="test",
    preempt=PreemptPolicy(preempt_type="partition_prio", preempt_mode="requeue", grace_time_s=GRACE),
)
OFF = dataclasses.replace(POLICY, preempt=PreemptPolicy())


def new_log(nodes: int = 1) -> Log:
    """A cluster of 8-GPU nodes that belong to every partition."""
    return Log(*cluster(nodes=nodes, partitions=PARTS))


def run(log: Log, job_id: int, partition: str, gpus: dict[str, list[int]], requeue: bool = True) -> None:
    """Submit a job to ``partition`` and start it on ``gpus`` (node -> indices), one second later."""
    spec = job(gpus=len(next(iter(gpus.values()))), nodes=len(gpus), partition=partition, requeue=requeue)
    log.add(submitted(job_id, spec))
    log.add(allocated(job_id, gpus, partition=partition, time_s=None))
    log.add(ev.RunStarted(job_id=job_id, attempt=0, node=next(iter(gpus)), pid=100 + job_id))
    assert log.state.jobs[job_id].state == "RUNNING"


def cycle(log: Log, pol: Policy, epoch: int = 0) -> Plan:
    """One scheduling cycle at the log's time; its decisions are appended (as the live scheduler does)."""
    out = plan(log.state, log.state.now, pol, epoch)
    log.add(*out.decisions)
    return out


def allocations(out: Plan) -> list[int]:
    """Ids of the jobs a plan starts."""
    return [d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)]


def preempted(out: Plan) -> list[ev.JobPreempted]:
    """The JobPreempted decisions of a plan."""
    return [d for d in out.decisions if isinstance(d, ev.JobPreempted)]


EIGHT = list(range(8))


@pytest.mark.parametrize(
    ("victim_part", "preemptor_part", "pol", "expected"),
    [
        (
            "low",
            "high",
            POLICY,
            ev.JobPreempted(job_id=1, attempt=0, mode="requeue", grace_s=GRACE, by_job=2),
        ),
        (
            "scavenger",
            "low",
            POLICY,
            ev.JobPreempted(job_id=1, attempt=0, mode="cancel", grace_s=30.0, by_job=2),
        ),
        ("low", "peer", POLICY, None),
        ("high", "high", POLICY, None),
        ("pinned", "high", POLICY, None),
        ("low", "high", OFF, None),
    ],
    ids=[
        "higher-tier-preempts-lower",
        "partition-mode-and-grace-override",
        "never-within-a-tier",
        "never-within-a-partition",
        "partition-preempt-mode-off",
        "preempt-type-off",
    ],
)
def test_who_preempts_whom_on_a_full_cluster(
    victim_part: str, preemptor_part: str, pol: Policy, expected: ev.JobPreempted | None
) -> None:
    log = new_log()
    run(log, 1, victim_part, {"gpu01": EIGHT})
    log.add(submitted(2, job(gpus=8, nodes=1, partition=preemptor_part)))
    out = cycle(log, pol, epoch=0)
    assert preempted(out) == ([expected] if expected else [])
    assert out.reasons[2] == "Resources"
    assert not allocations(out)


# (id, victim partition, victim --requeue, how the run ends, conclusion, victim's state, restart count)
GRACE_CASES = [
    (
        "requeue-mode-killed-after-grace",
        "low",
        True,
        exited(1, "gpu01", exit_code=0, signal=9, killed=True),
        ev.JobRequeued(job_id=1, attempt=0, reason="Preempted"),
        "PENDING",
        1,
    ),
    (
        "requeue-mode-script-checkpoints-and-exits-0",
        "low",
        True,
        exited(1, "gpu01", exit_code=0),
        ev.JobRequeued(job_id=1, attempt=0, reason="Preempted"),
        "PENDING",
        1,
    ),
    (
        "cancel-mode-ends-preempted",
        "scavenger",
        True,
        exited(1, "gpu01", exit_code=0, signal=15, killed=True),
        ev.JobFailed(job_id=1, attempt=0, reason="Preempted", signal=15),
        "PREEMPTED",
        0,
    ),
    (
        "requeue-mode-no-requeue-job-is-cancelled",
        "low",
        False,
        exited(1, "gpu01", exit_code=0, signal=9, killed=True),
        ev.JobFailed(job_id=1, attempt=0, reason="Preempted", signal=9),
        "PREEMPTED",
        0,
    ),
]


@pytest.mark.parametrize(
    ("victim_part", "requeue", "exit", "conclusion", "state", "restarts"),
    [c[1:] for c in GRACE_CASES],
    ids=[c[0] for c in GRACE_CASES],
)
def test_preemption_with_grace(
    victim_part: str,
    requeue: bool,
    exit: ev.RunExited,
    conclusion: ev.Event,
    state: str,
    restarts: int,
) -> None:
    log = new_log()
    run(log, 1, victim_part, {"gpu01": EIGHT}, requeue=requeue)
    log.add(submitted(2, job(gpus=8, nodes=1, partition="high")))
    (decision,) = preempted(cycle(log, POLICY, epoch=3))
    grace = 30.0 if victim_part == "scavenger" else GRACE
    assert (decision.grace_s, decision.epoch) == (grace, 3)
    assert decision.mode == ("requeue" if victim_part == "low" and requeue else "cancel")
    decided_at = log.at
    victim = log.state.jobs[1]
    assert victim.state == "RUNNING"
    assert victim.preempting == Preemption(mode=decision.mode, grace_s=grace, at=decided_at, by_job=2)
    # The run is killed with the grace time between SIGTERM and SIGKILL.
    assert orders(log.state, POLICY) == [
        api.KillOrder(
            job_id=1, attempt=0, node="gpu01", reason="preempt", grace_s=grace, cause_id=log.allocation_id(1)
        )
    ]
    # While it drains: no second preemption, the preemptor holds the reservation for the grace's end.
    draining = cycle(log, POLICY, epoch=3)
    assert draining.decisions == []
    assert draining.reasons == {2: "Resources"}
    assert draining.starts == {2: decided_at + grace}
    # The exit is reported: the victim is concluded and the preemptor starts in that cycle.
    log.add(exit)
    after = cycle(log, POLICY, epoch=3)
    assert after.decisions[0] == msgspec.structs.replace(conclusion, epoch=3)  # every decision: its epoch
    assert allocations(after) == [2]
    assert (victim.state, victim.restart_count) == (state, restarts)
    assert log.state.jobs[2].state == "RUNNING"
    if state == "PREEMPTED":
        assert victim.end_reason == "Preempted" and 1 not in log.state.active
    else:
        # Requeued: pending again, and a lower tier's job does not preempt back.
        assert victim.preempting is None
        again = cycle(log, POLICY, epoch=3)
        assert (again.decisions, again.reasons) == ([], {1: "Resources"})


def test_a_preempted_run_whose_node_goes_down_is_concluded_as_preempted() -> None:
    log = new_log(nodes=2)
    run(log, 1, "low", {"gpu01": EIGHT})
    run(log, 3, "low", {"gpu02": EIGHT})
    log.add(submitted(2, job(gpus=8, nodes=1, partition="high")))
    assert [d.job_id for d in preempted(cycle(log, POLICY))] == [3]  # the latest start
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    out = cycle(log, POLICY)
    assert out.decisions == [ev.JobRequeued(job_id=3, attempt=0, reason="Preempted")]
    assert log.state.jobs[3].state == "PENDING"
    # The down node's agent may have died alone: its GPUs stay held until it reports the run gone.
    assert [(o.job_id, o.node) for o in log.state.orphans] == [(3, "gpu02")]


def test_a_cancel_during_the_grace_wins_and_shares_the_kill_order() -> None:
    log = new_log()
    run(log, 1, "low", {"gpu01": EIGHT})
    log.add(submitted(2, job(gpus=8, nodes=1, partition="high")))
    cycle(log, POLICY)
    log.add(ev.JobCancelRequested(job_id=1, user="alice"))
    (kill,) = orders(log.state, POLICY)
    assert api.order_msg_id(kill) == "1:0:gpu01:kill" and kill.reason == "cancel"
    log.add(exited(1, "gpu01", exit_code=0, signal=15, killed=True))
    out = cycle(log, POLICY)
    assert out.decisions[0] == ev.JobCancelled(job_id=1, attempt=0, by="alice", signal=15)
    assert log.state.jobs[1].state == "CANCELLED"


Running = tuple[int, str, dict[str, list[int]]]

# (id, runs in start order (job, partition, node -> GPUs), preemptor (GPUs per node, nodes), expected victims)
VICTIM_CASES: list[tuple[str, list[Running], tuple[int, int], list[int]]] = [
    (
        "latest-started-first-and-no-more-than-needed",
        [
            (1, "low", {"gpu01": [0, 1]}),
            (3, "low", {"gpu01": [2, 3]}),
            (4, "low", {"gpu01": [4, 5]}),
            (5, "low", {"gpu01": [6, 7]}),
        ],
        (4, 1),
        [5, 4],
    ),
    (
        "fewest-gpus-wasted",
        [(1, "low", {"gpu01": EIGHT}), (3, "low", {"gpu02": [0, 1]}), (4, "low", {"gpu02": [2, 3]})],
        (6, 1),
        [4],
    ),
    (
        "lowest-tier-before-fewest-gpus",
        [(1, "scavenger", {"gpu01": EIGHT}), (3, "low", {"gpu02": [0, 1]}), (4, "low", {"gpu02": [2, 3]})],
        (6, 1),
        [1],
    ),
    (
        "a-multi-node-victim-wastes-all-its-nodes",
        [(1, "low", {"gpu01": EIGHT}), (3, "low", {"gpu02": EIGHT, "gpu03": EIGHT})],
        (8, 1),
        [1],
    ),
    (
        "a-multi-node-preemptor-frees-whole-nodes",
        [(1, "low", {"gpu01": EIGHT}), (3, "low", {"gpu02": EIGHT}), (4, "low", {"gpu03": EIGHT})],
        (8, 2),
        [4, 3],
    ),
    (
        "unpreemptable-runs-are-worked-around",
        [
            (1, "pinned", {"gpu01": [0, 1, 2, 3]}),
            (3, "low", {"gpu01": [4, 5, 6, 7]}),
            (4, "high", {"gpu02": EIGHT}),
            (5, "low", {"gpu03": [0, 1]}),
        ],
        (8, 1),
        [5],
    ),
    (
        "nothing-when-even-every-victim-would-not-make-room",
        [
            (1, "low", {"gpu01": [0, 1, 2, 3]}),
            (3, "high", {"gpu01": [4, 5, 6, 7]}),
            (4, "high", {"gpu02": EIGHT}),
            (5, "pinned", {"gpu03": EIGHT}),
        ],
        (8, 1),
        [],
    ),
]


@pytest.mark.parametrize(
    ("runs", "want", "victims"), [c[1:] for c in VICTIM_CASES], ids=[c[0] for c in VICTIM_CASES]
)
def test_a_minimal_victim_set(runs: list[Running], want: tuple[int, int], victims: list[int]) -> None:
    # Exactly the nodes the runs use: the cluster is full.
    log = new_log(nodes=len({node for _, _, gpus in runs for node in gpus}))
    for job_id, part, gpus in runs:
        run(log, job_id, part, gpus)
    log.add(submitted(2, job(gpus=want[0], nodes=want[1], partition="high")))
    out = cycle(log, POLICY)
    assert [d.job_id for d in preempted(out)] == victims
    assert all(d.by_job == 2 for d in preempted(out))


def test_a_job_whose_victims_drain_preempts_nothing_more_and_nobody_preempts_them_again() -> None:
    log = new_log(nodes=2)
    run(log, 1, "low", {"gpu01": EIGHT})
    run(log, 3, "low", {"gpu02": EIGHT})
    log.add(submitted(2, job(gpus=8, nodes=1, partition="high")))
    assert [d.job_id for d in preempted(cycle(log, POLICY))] == [3]
    # More room wanted behind it, by the same partition (Priority) and another high-tier partition job.
    log.add(submitted(4, job(gpus=8, nodes=1, partition="high")))
    out = cycle(log, POLICY)
    assert out.decisions == [] and out.reasons == {2: "Resources", 4: "Priority"}
    # A second JobPreempted of the same run (a stale or duplicate decision) changes nothing.
    before = semantic(log.state)
    log.add(ev.JobPreempted(job_id=3, attempt=0, mode="cancel", grace_s=1.0, by_job=4))
    assert semantic(log.state) == before


def test_two_preemptors_of_one_cycle_never_share_a_victim() -> None:
    pol = dataclasses.replace(
        POLICY, partitions=(*POLICY.partitions, PartitionPolicy("urgent", False, None, None, 2))
    )
    log = Log(*cluster(nodes=2, partitions=(*PARTS, "urgent")))
    run(log, 1, "low", {"gpu01": EIGHT})
    run(log, 3, "low", {"gpu02": EIGHT})
    log.add(submitted(2, job(gpus=8, nodes=1, partition="high")))
    log.add(submitted(4, job(gpus=8, nodes=1, partition="urgent")), step=0)
    out = cycle(log, pol)
    assert [(d.job_id, d.by_job) for d in preempted(out)] == [(3, 2), (1, 4)]


@pytest.mark.parametrize(
    "fields",
    [{"held": True}, {"dependencies": ev.Dependencies(items=[ev.Dependency(type="afterok", job_id=1)])}],
    ids=["held", "dependency-not-met"],
)
def test_an_ineligible_job_never_preempts(fields: dict[str, object]) -> None:
    log = new_log()
    run(log, 1, "low", {"gpu01": EIGHT})
    log.add(submitted(2, job(gpus=8, nodes=1, partition="high", **fields)))
    assert preempted(cycle(log, POLICY)) == []


def test_a_job_that_fits_now_starts_without_preempting() -> None:
    log = new_log()
    run(log, 1, "low", {"gpu01": [0, 1, 2, 3]})
    log.add(submitted(2, job(gpus=4, nodes=1, partition="high")))
    out = cycle(log, POLICY)
    assert allocations(out) == [2] and preempted(out) == []


def test_the_fold_guards_preemption() -> None:
    log = new_log()
    run(log, 1, "low", {"gpu01": EIGHT})
    log.add(ev.JobPreempted(job_id=1, attempt=0, mode="requeue", grace_s=5.0, by_job=9, epoch=2))
    assert log.state.epoch == 2 and log.state.jobs[1].preempting is not None
    log.add(ev.JobRequeued(job_id=1, attempt=0, reason="Preempted", epoch=2))
    before = semantic(log.state)
    # A stale epoch, a stale attempt, a pending job: nothing changes.
    log.add(ev.JobPreempted(job_id=1, attempt=1, mode="requeue", grace_s=5.0, by_job=9, epoch=1))
    log.add(ev.JobPreempted(job_id=1, attempt=0, mode="requeue", grace_s=5.0, by_job=9, epoch=2))
    log.add(ev.JobPreempted(job_id=1, attempt=-1, mode="requeue", grace_s=5.0, by_job=9, epoch=2))
    assert semantic(log.state) == before
    assert log.state.jobs[1].preempting is None and log.state.jobs[1].restart_count == 1


def test_replaying_a_preemption_log_rebuilds_the_live_state() -> None:
    log = new_log(nodes=2)
    run(log, 1, "scavenger", {"gpu01": EIGHT})
    run(log, 3, "low", {"gpu02": EIGHT})
    log.add(submitted(2, job(gpus=8, nodes=2, partition="high")))
    cycle(log, POLICY)
    log.add(exited(1, "gpu01", exit_code=0, signal=9, killed=True))
    cycle(log, POLICY)
    log.add(exited(3, "gpu02", exit_code=0, signal=15, killed=True))
    cycle(log, POLICY)
    assert [log.state.jobs[j].state for j in (1, 2, 3)] == ["PREEMPTED", "RUNNING", "PENDING"]
    assert encode_state(fold(log.entries)) == encode_state(log.state)


def test_accounting_projects_the_conclusion_not_the_order() -> None:
    order = ev.JobPreempted(job_id=1, attempt=0, mode="cancel", grace_s=5.0, by_job=2)
    ended = ev.JobFailed(job_id=1, attempt=0, reason="Preempted", signal=9)
    ops = convert(numbered([env(order), env(ended, at=T0 + 5)]))
    assert [(type(op).__name__, getattr(op, "state", None), getattr(op, "reason", None)) for op in ops] == [
        ("EndJob", "PREEMPTED", "Preempted")
    ]


CONFIG = """
[scheduler]
preempt_type = "partition_prio"
preempt_mode = "cancel"
preempt_grace_time = "2:00"

[[nodes]]
names = "gpu[01-02]"
cpus = 8
gpus = 8

[[partitions]]
name = "low"
default = true
{low}

[[partitions]]
name = "high"
priority_tier = 2
"""


def test_preemption_config_reaches_the_policy() -> None:
    pol = policy_of(parse_config(CONFIG.format(low='preempt_mode = "requeue"\ngrace_time = 30')))
    assert pol.preempt == PreemptPolicy(
        preempt_type="partition_prio", preempt_mode="cancel", grace_time_s=120.0
    )
    low, high = pol.partitions
    assert (low.preempt_mode, low.grace_time_s, high.preempt_mode, high.grace_time_s) == (
        "requeue",
        30.0,
        None,
        None,
    )
    assert policy_of(parse_config(CONFIG.format(low="").replace("preempt_", "#"))).preempt == PreemptPolicy()


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (CONFIG.replace('"partition_prio"', '"partition"'), "scheduler.preempt_type"),
        (CONFIG.replace('preempt_mode = "cancel"', 'preempt_mode = "off"'), "scheduler.preempt_mode"),
        (CONFIG.replace('"2:00"', "-1"), "scheduler.preempt_grace_time"),
        (CONFIG.format(low='preempt_mode = "suspend"'), "partitions[0].preempt_mode"),
        (CONFIG.format(low='grace_time = "UNLIMITED"'), "partitions[0].grace_time"),
        (CONFIG.format(low="grace_time = true"), "partitions[0].grace_time"),
    ],
    ids=["type", "scheduler-mode", "negative-grace", "partition-mode", "unlimited-grace", "bool-grace"],
)
def test_bad_preemption_config_is_named(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: "):
        parse_config(text.format(low="") if "{low}" in text else text)
