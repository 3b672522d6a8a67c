"""PreemptType=preempt/qos: who preempts whom by QOS preempt lists, the victim QOS's mode and grace."""

from __future__ import annotations

import dataclasses

import pytest
from builders import Log, allocated, cluster, exited, job, submitted

from corral.libs.config.cluster import parse_config
from corral.libs.core.fold import fold
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import PartitionPolicy, Policy
from corral.libs.core.preempt import PreemptPolicy
from corral.libs.core.qos import QosPolicy
from corral.libs.core.state import encode_state
from corral.schemas import events as ev
from corral.services.scheduler.views import policy_of

pytestmark = pytest.mark.unit

#: Every node is in every partition. Tiers: low 1 < high 2; "shielded" sets a partition PreemptMode
#: that only partition_prio reads; jobs of "urgentpart" get QOS urgent by default.
PARTS = ("low", "high", "shielded", "urgentpart")
DEFAULT_GRACE = 60.0
QOS = (
    QosPolicy("urgent", priority=100, preempt=("scavenger", "killable", "standard", "pinned")),
    QosPolicy("standard", priority=10),  # says nothing: the scheduler's mode and grace
    QosPolicy("scavenger", preempt_mode="requeue", grace_time_s=30),
    QosPolicy("killable", preempt_mode="cancel", grace_time_s=5),
    QosPolicy("pinned", preempt_mode="off"),
)
QOS_POLICY = Policy(
    partitions=(
        PartitionPolicy("low", True, None, None, 1),
        PartitionPolicy("high", False, None, None, 2),
        PartitionPolicy("shielded", False, None, None, 1, preempt_mode="off", grace_time_s=1.0),
        PartitionPolicy("urgentpart", False, None, None, 1, qos="urgent"),
    ),
    cluster="test",
    preempt=PreemptPolicy(preempt_type="qos", preempt_mode="cancel", grace_time_s=DEFAULT_GRACE),
    qos=QOS,
)
PARTITION_PRIO = dataclasses.replace(
    QOS_POLICY, preempt=dataclasses.replace(QOS_POLICY.preempt, preempt_type="partition_prio")
)
OFF = dataclasses.replace(QOS_POLICY, preempt=PreemptPolicy())
EIGHT = list(range(8))


def new_log(nodes: int = 1) -> Log:
    """A cluster of 8-GPU nodes that belong to every partition."""
    return Log(*cluster(nodes=nodes, partitions=PARTS))


def run(
    log: Log, job_id: int, qos: str | None, partition: str, node: str = "gpu01", requeue: bool = True
) -> None:
    """Submit a job of ``qos`` to ``partition`` and start it on all 8 GPUs of ``node``."""
    log.add(submitted(job_id, job(gpus=8, nodes=1, partition=partition, qos=qos, requeue=requeue)))
    log.add(allocated(job_id, {node: EIGHT}, partition=partition, time_s=None))
    log.add(ev.RunStarted(job_id=job_id, attempt=0, node=node, pid=100 + job_id))
    assert log.state.jobs[job_id].state == "RUNNING"


def cycle(log: Log, pol: Policy) -> Plan:
    """One scheduling cycle at the log's time; its decisions are appended."""
    out = plan(log.state, log.state.now, pol)
    log.add(*out.decisions)
    return out


def preempted(out: Plan) -> list[ev.JobPreempted]:
    """The JobPreempted decisions of a plan."""
    return [d for d in out.decisions if isinstance(d, ev.JobPreempted)]


def decision(mode: ev.PreemptMode, grace: float) -> ev.JobPreempted:
    """Job 1 preempted by job 2."""
    return ev.JobPreempted(job_id=1, attempt=0, mode=mode, grace_s=grace, by_job=2)


# (id, victim (qos, partition, --requeue), preemptor (qos, partition), policy, expected decision)
Victim = tuple[str | None, str, bool]
WhoCase = tuple[str, Victim, tuple[str | None, str], Policy, ev.JobPreempted | None]
WHO_CASES: list[WhoCase] = [
    ("requeue-and-grace-from-the-victim-qos", ("scavenger", "low", True), ("urgent", "low"), QOS_POLICY,
     decision("requeue", 30.0)),
    ("cancel-and-grace-from-the-victim-qos", ("killable", "low", True), ("urgent", "low"), QOS_POLICY,
     decision("cancel", 5.0)),
    ("a-silent-qos-takes-the-scheduler-defaults", ("standard", "low", True), ("urgent", "low"), QOS_POLICY,
     decision("cancel", DEFAULT_GRACE)),
    ("no-requeue-job-is-cancelled", ("scavenger", "low", False), ("urgent", "low"), QOS_POLICY,
     decision("cancel", 30.0)),
    ("qos-not-listed", (None, "low", True), ("urgent", "low"), QOS_POLICY, None),
    ("qos-mode-off-never-preempted", ("pinned", "low", True), ("urgent", "low"), QOS_POLICY, None),
    ("never-within-a-qos", ("urgent", "low", True), ("urgent", "low"), QOS_POLICY, None),
    ("a-list-is-one-way", ("urgent", "low", True), ("scavenger", "low"), QOS_POLICY, None),
    ("any-partition-even-a-higher-tier", ("scavenger", "high", True), ("urgent", "low"), QOS_POLICY,
     decision("requeue", 30.0)),
    ("partition-mode-is-not-read", ("scavenger", "shielded", True), ("urgent", "low"), QOS_POLICY,
     decision("requeue", 30.0)),
    ("preemptor-qos-from-its-partition", ("killable", "low", True), (None, "urgentpart"), QOS_POLICY,
     decision("cancel", 5.0)),
    ("partition-tiers-do-not-preempt-under-qos", (None, "low", True), (None, "high"), QOS_POLICY, None),
    ("partition-prio-ignores-qos-lists", ("scavenger", "low", True), ("urgent", "low"), PARTITION_PRIO, None),
    ("partition-prio-ignores-qos-mode-and-grace", ("scavenger", "low", True), (None, "high"), PARTITION_PRIO,
     decision("cancel", DEFAULT_GRACE)),
    ("partition-prio-ignores-qos-off", ("pinned", "low", True), (None, "high"), PARTITION_PRIO,
     decision("cancel", DEFAULT_GRACE)),
    ("preempt-type-off", ("scavenger", "low", True), ("urgent", "low"), OFF, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("victim", "preemptor", "pol", "expected"), [c[1:] for c in WHO_CASES], ids=[c[0] for c in WHO_CASES]
)
def test_who_preempts_whom_by_qos(
    victim: tuple[str | None, str, bool],
    preemptor: tuple[str | None, str],
    pol: Policy,
    expected: ev.JobPreempted | None,
) -> None:
    log = new_log()
    run(log, 1, victim[0], victim[1], requeue=victim[2])
    log.add(submitted(2, job(gpus=8, nodes=1, qos=preemptor[0], partition=preemptor[1])))
    out = cycle(log, pol)
    assert preempted(out) == ([expected] if expected else [])
    assert out.reasons[2] == "Resources"


def test_the_lowest_qos_priority_is_preempted_first() -> None:
    # The standard run started last (partition_prio's tie-break would pick it); its QOS is worth more.
    log = new_log(nodes=2)
    run(log, 1, "scavenger", "low", node="gpu01")
    run(log, 3, "standard", "low", node="gpu02")
    log.add(submitted(2, job(gpus=8, nodes=1, qos="urgent", partition="low")))
    assert [d.job_id for d in preempted(cycle(log, QOS_POLICY))] == [1]


def test_a_qos_preemption_requeues_the_victim_and_starts_the_preemptor() -> None:
    log = new_log()
    run(log, 1, "scavenger", "low")
    log.add(submitted(2, job(gpus=8, nodes=1, qos="urgent", partition="low")))
    assert preempted(cycle(log, QOS_POLICY)) == [
        ev.JobPreempted(job_id=1, attempt=0, mode="requeue", grace_s=30.0, by_job=2)
    ]
    assert log.state.jobs[1].preempting is not None and log.state.jobs[1].preempting.grace_s == 30.0
    # While the victim drains, the preemptor waits for the end of the grace and preempts nothing more.
    draining = cycle(log, QOS_POLICY)
    assert draining.decisions == [] and draining.starts == {2: log.state.jobs[1].preempting.at + 30.0}
    log.add(exited(1, "gpu01", exit_code=0, signal=15, killed=True))
    after = cycle(log, QOS_POLICY)
    assert after.decisions[0] == ev.JobRequeued(job_id=1, attempt=0, reason="Preempted")
    assert [d.job_id for d in after.decisions if isinstance(d, ev.JobAllocated)] == [2]
    victim = log.state.jobs[1]
    assert (victim.state, victim.restart_count, log.state.jobs[2].state) == ("PENDING", 1, "RUNNING")
    # The requeued scavenger job does not preempt back (its QOS lists nothing).
    assert preempted(cycle(log, QOS_POLICY)) == []
    assert encode_state(fold(log.entries)) == encode_state(log.state)


def test_qos_preemption_is_deterministic() -> None:
    def decisions() -> list[ev.Event]:
        log = new_log(nodes=3)
        run(log, 1, "standard", "low", node="gpu01")
        run(log, 3, "killable", "high", node="gpu02")
        run(log, 4, "scavenger", "low", node="gpu03")
        log.add(submitted(2, job(gpus=8, nodes=2, qos="urgent", partition="low")))
        return plan(log.state, log.state.now, QOS_POLICY).decisions

    first = decisions()
    # killable and scavenger have priority 0 (lowest); the later start goes first.
    assert [(d.job_id, d.mode) for d in first if isinstance(d, ev.JobPreempted)] == [
        (4, "requeue"),
        (3, "cancel"),
    ]
    assert all(decisions() == first for _ in range(3))


CONFIG = """
[scheduler]
preempt_type = "qos"
preempt_mode = "cancel"
preempt_grace_time = 90

[[nodes]]
names = "gpu[01-02]"
cpus = 8
gpus = 8

[[partitions]]
name = "gpu"
default = true

[[qos]]
name = "urgent"
priority = 100
preempt = ["scavenger", "pinned", "normal"]

[[qos]]
name = "scavenger"
preempt_mode = "requeue"
grace_time = "1:00"

[[qos]]
name = "pinned"
preempt_mode = "off"
"""


def test_qos_preemption_config_reaches_the_policy() -> None:
    pol = policy_of(parse_config(CONFIG))
    assert pol.preempt == PreemptPolicy(preempt_type="qos", preempt_mode="cancel", grace_time_s=90.0)
    q = pol.qos_by_name
    assert q["urgent"].preempt == ("scavenger", "pinned", "normal")
    assert (q["urgent"].preempt_mode, q["urgent"].grace_time_s) == (None, None)
    assert (q["scavenger"].preempt_mode, q["scavenger"].grace_time_s) == ("requeue", 60)
    assert q["pinned"].preempt_mode == "off"
