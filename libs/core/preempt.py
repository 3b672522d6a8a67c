"""Preemption: a blocked job of a higher tier makes room by having lower-tier runs killed.

Pure and deterministic, like the rest of the core. Slurm's model, in Slurm's words:

- ``PreemptPolicy.preempt_type`` (Slurm's PreemptType): ``off`` (preempt/none, the default),
  ``partition_prio`` (a pending job of a partition with a higher PriorityTier may preempt running jobs
  of partitions with a lower one, on the nodes the partitions share; never within a tier), or ``qos``
  (a pending job may preempt running jobs whose QOS its own QOS's ``preempt`` list names, of any
  partition, on the nodes of the preemptor's partition; partition tiers then preempt nothing);
- the victim says what happens to it: with ``partition_prio`` its run's partition (``preempt_mode``,
  ``grace_time``), with ``qos`` its QOS (the same two keys), else the scheduler's defaults: ``requeue``
  (PENDING again, restart count + 1; a ``--no-requeue`` job is cancelled instead, as in Slurm),
  ``cancel`` (it ends PREEMPTED) or, set on the partition or QOS, ``off`` (never preempted);
- a preemption is a decision (``JobPreempted``), then a kill order: SIGCONT+SIGTERM at once, SIGKILL after
  the grace time (KillWait when it is 0). The victim stays RUNNING until its exit is reported (or its
  node goes down); then ``conclusion`` requeues it or ends it PREEMPTED.

Who is preempted: only the first job of its partition that could not start (not held, not ineligible:
those never reach the planner) preempts, and only if it would fit *now* once the victims are gone. The
victim set is minimal (no victim can be spared) and chosen deterministically: candidates are ranked
least valuable first (``value``: the run's partition tier, or with ``qos`` the job's QOS priority), then
latest start, then highest id; the nodes to free are those whose victims are of the lowest value, waste
the fewest GPUs, are fewest and rank first, then by name. A run is preempted at
most once, and while a job's victims drain it preempts nothing more: the planner counts their resources as
released at ``decided + grace`` (``expected_end``), so the preemptor holds the reservation and starts in
the cycle after the last victim's exit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import msgspec

from corral.libs.core.causation import ALLOCATED
from corral.libs.core.limits import qos_name, qos_of
from corral.libs.core.placement import Free, Request, eligible, give_back, node_fits, pick
from corral.libs.core.state import Job, State
from corral.schemas import api
from corral.schemas import events as ev

if TYPE_CHECKING:
    from corral.libs.core.policy import Policy

#: Slurm's PreemptType: preempt/none, preempt/partition_prio, preempt/qos.
PreemptType = Literal["off", "partition_prio", "qos"]
#: A partition's PreemptMode: ``off`` = its jobs are never preempted.
PartitionPreemptMode = Literal["requeue", "cancel", "off"]


@dataclass(frozen=True)
class PreemptPolicy:
    """How the scheduler preempts (``[scheduler]`` of the configuration)."""

    preempt_type: PreemptType = "off"  # PreemptType: off | partition_prio | qos
    preempt_mode: ev.PreemptMode = "requeue"  # PreemptMode of partitions (or QOS) that do not set theirs
    grace_time_s: float = 0.0  # GraceTime of partitions (or QOS) that do not set theirs (0: KillWait)


def partition_may_preempt(policy: Policy, preemptor: Job, victim: Job) -> bool:
    """partition_prio: the preemptor's partition has a strictly higher PriorityTier than the victim run's."""
    mine = policy.by_name.get(policy.partition_of(preemptor))
    theirs = policy.by_name.get(victim.partition)
    return mine is not None and theirs is not None and mine.tier > theirs.tier


def qos_may_preempt(policy: Policy, preemptor: Job, victim: Job) -> bool:
    """preempt/qos: whether the preemptor's QOS lists the victim's QOS in its ``preempt`` list.

    A QOS never lists itself (the configuration refuses it), so jobs of one QOS never preempt each other.
    A QOS no longer configured preempts nothing (and is preempted by whoever still lists its name).
    """
    return qos_name(policy, victim) in qos_of(policy, preemptor).preempt


def may_preempt(policy: Policy, preemptor: Job, victim: Job) -> bool:
    """Whether ``preemptor`` may preempt the run of ``victim`` under the configured PreemptType."""
    if terms(policy, victim).mode == "off":
        return False
    if policy.preempt.preempt_type == "partition_prio":
        return partition_may_preempt(policy, preemptor, victim)
    if policy.preempt.preempt_type == "qos":
        return qos_may_preempt(policy, preemptor, victim)
    return False


@dataclass(frozen=True)
class Terms:
    """What happens to a victim's run when it is preempted."""

    mode: PartitionPreemptMode  # PreemptMode: requeue, cancel, or off (never preempted)
    grace_s: float  # GraceTime: seconds between SIGTERM and SIGKILL (0: KillWait)


def terms(policy: Policy, victim: Job) -> Terms:
    """A victim's PreemptMode and GraceTime, each its own source's else the scheduler's default.

    The source is the victim's QOS with ``preempt_type = "qos"`` (Slurm: the preempted job's QOS), else
    its run's partition (Slurm's partition PreemptMode applies to partition_prio only).
    """
    mode: PartitionPreemptMode | None
    grace: float | None
    if policy.preempt.preempt_type == "qos":
        qos = qos_of(policy, victim)
        mode, grace = qos.preempt_mode, qos.grace_time_s
    else:
        part = policy.by_name.get(victim.partition)
        mode = part.preempt_mode if part is not None else None
        grace = part.grace_time_s if part is not None else None
    return Terms(
        mode if mode is not None else policy.preempt.preempt_mode,
        grace if grace is not None else policy.preempt.grace_time_s,
    )


def value(policy: Policy, victim: Job) -> int:
    """How valuable a victim's run is (the lowest is preempted first): its partition's PriorityTier, or
    with ``preempt_type = "qos"`` its QOS's priority (Slurm ranks preempt/qos victims by QOS priority)."""
    if policy.preempt.preempt_type == "qos":
        return qos_of(policy, victim).priority
    part = policy.by_name.get(victim.partition)
    return part.tier if part is not None else 1


def expected_end(job: Job, end: float) -> float:
    """When a running job's resources come back: ``end``, or sooner if it is being preempted."""
    p = job.preempting
    return end if p is None else min(end, p.at + p.grace_s)


def draining_for(state: State) -> set[int]:
    """Ids of the pending jobs whose victims are still being killed (they preempt nothing more)."""
    out = set()
    for job_id in state.active:
        job = state.jobs[job_id]
        if job.state == "RUNNING" and job.preempting is not None:
            out.add(job.preempting.by_job)
    return out


def conclusion(job: Job) -> ev.Event:
    """The conclusion of a preempted run that ended (or lost its node): requeue it, or end it PREEMPTED."""
    p = job.preempting
    assert p is not None
    attempt = job.restart_count
    if p.mode == "requeue" and job.spec.requeue:
        return ev.JobRequeued(job_id=job.job_id, attempt=attempt, reason="Preempted")
    run = job.run_exit
    return ev.JobFailed(
        job_id=job.job_id,
        attempt=attempt,
        reason="Preempted",
        exit_code=run.exit_code if run is not None else 0,
        signal=run.signal if run is not None else 0,
    )


def kill_order(job: Job) -> api.KillOrder:
    """The order that kills a run being preempted, on its batch node, with its grace time."""
    p = job.preempting
    assert p is not None
    return api.KillOrder(
        job_id=job.job_id,
        attempt=job.restart_count,
        node=job.allocations[0].node,
        reason="preempt",
        grace_s=p.grace_s if p.grace_s > 0 else None,
        cause_id=job.causes.get(ALLOCATED),
    )


def preempt_for(
    state: State,
    policy: Policy,
    job: Job,
    req: Request,
    members: Iterable[Free],
    spared: set[int],
    epoch: int = 0,
) -> list[ev.JobPreempted]:
    """The decisions that preempt a minimal set of runs so that ``job`` fits now; [] if none does.

    ``members`` is the free capacity of the nodes of the job's partition as the cycle has it so far;
    ``spared`` holds jobs that may not be chosen (concluded or preempted earlier in the cycle).
    """
    nodes = {f.name: f for f in members if eligible(f, req)}
    ranked = _candidates(state, policy, job, nodes, spared)
    chosen = _choose(nodes, req, ranked, lambda v: value(policy, v))
    out = []
    for victim in chosen:
        given = terms(policy, victim)
        out.append(
            ev.JobPreempted(
                job_id=victim.job_id,
                attempt=victim.restart_count,
                # Slurm: a job that may not be requeued is cancelled when preempted in requeue mode.
                mode="requeue" if given.mode == "requeue" and victim.spec.requeue else "cancel",
                grace_s=given.grace_s,
                by_job=job.job_id,
                epoch=epoch,
            )
        )
    return out


def _candidates(
    state: State, policy: Policy, job: Job, nodes: dict[str, Free], spared: set[int]
) -> list[Job]:
    """Running jobs on ``nodes`` that ``job`` may preempt, least valuable first."""
    out = []
    for job_id in state.active:
        victim = state.jobs[job_id]
        if (
            victim.state != "RUNNING"
            or victim.run_exit is not None
            or victim.preempting is not None
            or victim.cancel_by is not None
            or job_id in spared
            or not any(a.node in nodes for a in victim.allocations)
        ):
            continue
        if may_preempt(policy, job, victim):
            out.append(victim)
    out.sort(key=lambda v: (value(policy, v), -(v.start_time or 0.0), -v.job_id))
    return out


def _without(nodes: dict[str, Free], gone: Iterable[Job]) -> dict[str, Free]:
    """A copy of ``nodes`` with the resources of ``gone`` given back (a node left with nothing is idle)."""
    trial = {name: msgspec.structs.replace(f, gpus=list(f.gpus)) for name, f in nodes.items()}
    for victim in gone:
        for alloc in victim.allocations:
            give_back(trial.get(alloc.node), alloc)
    for f in trial.values():
        full = f.cpus >= f.total_cpus and len(f.gpus) >= f.total_gpus and f.mem_mb >= f.total_mem_mb
        f.idle = f.idle or full
    return trial


def _fits(nodes: dict[str, Free], req: Request, gone: Iterable[Job]) -> bool:
    trial = _without(nodes, gone)
    fit = [trial[name] for name in sorted(trial) if node_fits(trial[name], req)]
    return pick(fit, req, lambda f: f.name) is not None


def _minimal(victims: list[Job], fits: Callable[[list[Job]], bool]) -> list[Job]:
    """Drop every victim that can be spared, trying the most valuable (last ranked) first."""
    kept = list(victims)
    for victim in reversed(victims):
        trial = [v for v in kept if v is not victim]
        if fits(trial):
            kept = trial
    return kept


def _node_victims(node: Free, one_node: Request, on_node: list[Job]) -> list[Job] | None:
    """A minimal set of ``on_node`` (the candidates on ``node``, in rank order) whose removal lets one node
    of the request fit there; None if even all of them do not."""
    alone = {node.name: node}
    gone: list[Job] = []
    for victim in on_node:
        if _fits(alone, one_node, gone):
            break
        gone.append(victim)
    if not _fits(alone, one_node, gone):
        return None
    return _minimal(gone, lambda g: _fits(alone, one_node, g))


def _choose(
    nodes: dict[str, Free], req: Request, ranked: list[Job], worth: Callable[[Job], int]
) -> list[Job]:
    """A minimal set of ``ranked`` whose removal lets ``req`` fit now, in rank order; [] if none does.

    Each node is costed on its own (the victims on it, in rank order, until one node of the request fits
    there, minimised); the request's nodes are the cheapest; the union of their victims is minimised again.
    """
    if not ranked or _fits(nodes, req, ()) or not _fits(nodes, req, ranked):
        return []
    rank = {v.job_id: i for i, v in enumerate(ranked)}
    one_node = msgspec.structs.replace(req, nodes=1, nodelist=())
    costs: dict[str, tuple[int, int, int, tuple[int, ...]]] = {}
    victims_of: dict[str, list[Job]] = {}
    by_node: dict[str, list[Job]] = {}
    for victim in ranked:
        for alloc in victim.allocations:
            by_node.setdefault(alloc.node, []).append(victim)
    for name in sorted(nodes):
        gone = _node_victims(nodes[name], one_node, by_node.get(name, []))
        if gone is None:
            continue
        victims_of[name] = gone
        costs[name] = (
            max((worth(v) for v in gone), default=0),  # least valuable (lowest tier or QOS) first
            sum(len(a.gpus) for v in gone for a in v.allocations),  # fewest GPUs lost
            len(gone),  # fewest runs killed
            tuple(sorted(rank[v.job_id] for v in gone)),  # least valuable (latest start) first
        )
    picked = pick(sorted(costs, key=lambda n: (costs[n], n)), req, lambda n: n)
    if picked is None:
        return []
    union = {v.job_id: v for name in picked for v in victims_of[name]}
    chosen = sorted(union.values(), key=lambda v: rank[v.job_id])
    if not _fits(nodes, req, chosen):
        return []
    return _minimal(chosen, lambda g: _fits(nodes, req, g))
