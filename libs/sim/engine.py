"""The simulator: replays a workload through the scheduler's pure core in virtual time.

It drives ``state.apply`` and ``plan.plan`` exactly as the scheduler service does, with a virtual
clock instead of NATS:

1. build the cluster: one ``NodeRegistered`` per node, at the first submit time;
2. take the next distinct event time ``now``: the earliest run end or submit still to come, or the
   last plan's ``wake_at`` (a begin time, a ``--switches`` wait that lapses, a reservation that starts)
   if that comes first;
3. apply the facts due then: ``RunExited(exit_code=0)`` from each node of each run ending now (batch first)
   (by job id), then ``JobSubmitted`` for each job submitted now (by submit order, then id);
4. cycle: ``plan(state, now, policy)``, apply its decisions as envelopes stamped ``now``, and again
   while the last cycle's decisions could let the next one decide more; each ``JobAllocated`` schedules
   its run's end at ``now + min(run time, time limit)`` (a run cut by its limit exits as timed out);
   each ``JobPreempted`` (preemption on in the policy) ends its victim's run at ``now + grace`` if
   that comes before its own end: the core then requeues the victim (it runs again, whole, when it is
   placed again: its record is its last run) or ends it PREEMPTED;
   A cycle frees the resources of the runs it concludes before it places jobs, so after a cycle that
   only allocated and concluded, another could only decide more if an ended job releases a dependent
   (dependencies, singleton): without such jobs in the workload that second cycle is skipped;
5. repeat from 2 until nothing is left to happen.

Why runs end through the log: the core concludes a run (``JobCompleted``) only after its node
reports the exit, as in production, so the simulated schedule is the one the service would make.

The policy is the configuration's whole policy (``libs/config/policy.py``: priority weights, fair share and
its usage billing, partition tiers, QOS and association limits, blocks, preemption) when the cluster
comes from one, with the backfill mode and window the caller gives; else the default policy (FIFO
priority, no limits) on the cluster's partitions. As the gateway does at submit, a job without an
account is charged to the first configured account that lists its user (else its user's own account).

A job that can never fit its partition (even on an idle cluster, once a ``--switches`` wait lapsed) is a
``SimError`` before the run
starts; so is a schedule that stops with jobs still pending.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from corral.libs.config.cluster import ClusterConfig
from corral.libs.config.policy import policy_of, usage_policy_of
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.causation import cause_of
from corral.libs.core.eligibility import needs_check
from corral.libs.core.fold import apply, slim_spec
from corral.libs.core.placement import Request, free_capacity, request_of
from corral.libs.core.plan import plan
from corral.libs.core.policy import Backfill, PartitionPolicy, Policy
from corral.libs.core.state import Job, State, UsagePolicy
from corral.libs.core.topology import fits_idle, in_force
from corral.libs.sim.reactions import REACTIONS
from corral.libs.sim.workload import SimJob
from corral.schemas import events as ev
from corral.schemas.codec import envelope
from corral.schemas.slim import SlimJobSpec

#: Partition of a cluster of identical units (``--units N``).
UNIT_PARTITION = "sim"
#: Writer of every simulated event.
ACTOR = "sim"


class SimError(RuntimeError):
    """The workload cannot be simulated on this cluster (the message names the job)."""


@dataclass(frozen=True)
class SimCluster:
    """A cluster to simulate: node inventory, partitions and the capacity utilisation is measured in."""

    nodes: tuple[ev.NodeRegistered, ...]  # registrations, in order
    partitions: tuple[PartitionPolicy, ...]  # the planner's partitions
    capacity: int  # total schedulable units (GPUs, or nodes for a GPU-less cluster)
    blocks: tuple[tuple[str, str], ...] = ()  # topology: (node, block) pairs from [[blocks]]
    policy: Policy | None = None  # the configuration's whole policy (None: the default on ``partitions``)
    usage: UsagePolicy | None = None  # how the fold bills usage for fair share (None: the default)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job."""

    id: int  # job id
    submit: float  # submit time
    start: float  # start of its (last) run
    end: float  # end of its run
    units: int  # units it held
    nodes: tuple[str, ...]  # nodes of its run, batch node first
    state: str  # final state (COMPLETED, TIMEOUT, ...)


@dataclass(frozen=True)
class SimResult:
    """The outcome of one simulation."""

    records: tuple[JobRecord, ...]  # every job, by (submit, id)
    capacity: int  # units of the cluster
    cycles: int  # plan() calls made


def unit_cluster(units: int) -> SimCluster:
    """``units`` nodes ``u0001..`` with 1 CPU and no GPU each, one partition (SWF processors)."""
    if units < 1:
        raise SimError(f"--units must be at least 1, not {units}")
    width = max(4, len(str(units)))
    nodes = tuple(
        ev.NodeRegistered(node=f"u{i:0{width}d}", cpus=1, mem_mb=1, partitions=[UNIT_PARTITION])
        for i in range(1, units + 1)
    )
    return SimCluster(nodes, (PartitionPolicy(UNIT_PARTITION, True, None, None),), units)


def config_cluster(config: ClusterConfig) -> SimCluster:
    """The nodes, partitions and whole scheduling policy of a cluster configuration (the scheduler
    service's, ``libs/config/policy.py``); capacity in GPUs (nodes if none)."""
    nodes = tuple(
        ev.NodeRegistered(
            node=n.name,
            cpus=n.cpus,
            mem_mb=n.mem_mb,
            gpus=n.gpus,
            gpu_type=n.gpu_type,
            partitions=config.partitions_of(n.name),
            features=list(n.features),
        )
        for n in config.nodes
    )
    policy = policy_of(config)
    gpus = sum(n.gpus for n in config.nodes)
    blocks = tuple(policy.blocks.items())
    return SimCluster(nodes, policy.partitions, gpus or len(nodes), blocks, policy, usage_policy_of(config))


def job_spec(job: SimJob) -> SlimJobSpec:
    """The submission of a simulated job: its own spec when it has one (a replayed log), else one task
    with 1 CPU on each node; slim, as the state keeps it (a simulated job has no script to run)."""
    if job.spec is not None:
        return slim_spec(job.spec)
    nodes = job.node_count
    return SlimJobSpec(
        name=f"sim-{job.id}",
        script="",
        workdir="/",
        partition=job.partition,
        nodes=nodes,
        ntasks=nodes,
        gpus_per_node=job.gpus_per_node,
        gpu_type=job.gpu_type,
        time_limit_s=job.req_time,
    )


class _Run:
    """One simulation in progress (the mutable part of ``simulate``)."""

    def __init__(self, jobs: Sequence[SimJob], cluster: SimCluster, policy: Policy) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.submit, j.id))
        self.policy = policy
        self.state = State() if cluster.usage is None else State(usage_policy=cluster.usage)
        self.seq = 0
        self.cycles = 0
        self.capacity = CapacityCache()  # the nodes' capacity, kept from cycle to cycle
        self.ends: list[tuple[float, int, int]] = []  # heap of (run end, job id, attempt)
        self.wake: float | None = None  # the last plan's wake_at, if still to come
        # The gateway's default account: the first account listing the user (else the user's own).
        self.accounts: dict[str, str] = {}
        for assoc in policy.associations:
            self.accounts.setdefault(assoc.user, assoc.account)
        self.by_id = {j.id: j for j in self.jobs}
        self.starts: dict[int, tuple[float, tuple[str, ...]]] = {}  # job id -> (start, nodes)
        self.records: dict[int, JobRecord] = {}
        # Whether an ended job can make another one eligible (only then does a cycle that concluded runs
        # need a second one).
        self.gated = any(needs_check(Job(job_id=0, user="", spec=job_spec(j), submit_time=0.0)) for j in jobs)
        at = float(self.jobs[0].submit) if self.jobs else 0.0
        for node in cluster.nodes:
            self.put(node, at)

    def put(self, body: ev.Event, at: float, cause: str | None = None) -> None:
        """Append one event (caused by the event id ``cause``) to the (virtual) log and fold it."""
        self.seq += 1
        env = envelope(body, actor=ACTOR, occurred_at=at, event_id=str(self.seq), causation_id=cause)
        apply(self.state, self.seq, env)

    def check_fits(self) -> None:
        """Refuse a job that could not run even on the idle cluster (it would block its queue forever)."""
        free = free_capacity(self.state.nodes)
        known: dict[tuple[str, Request], bool] = {}
        wait = self.policy.max_switch_wait_s
        for sim_job in self.jobs:
            spec = self.spec_of(sim_job)
            job = Job(job_id=sim_job.id, user=sim_job.user, spec=spec, submit_time=sim_job.submit)
            # A --switches count lapses after its wait (the core then places the job without it).
            key = (self.policy.partition_of(job), in_force(request_of(job), job, math.inf, wait))
            if key not in known:
                members = [f for f in free.values() if key[0] in f.partitions]
                known[key] = fits_idle(members, key[1], self.policy.blocks)
            if not known[key]:
                raise SimError(
                    f"job {sim_job.id} ({spec.nodes} nodes, {spec.gpus_per_node} GPUs each) "
                    f"can never run in partition {key[0]!r} of this cluster"
                )

    def spec_of(self, sim_job: SimJob) -> SlimJobSpec:
        """The job's submission as the gateway records it (its default account resolved)."""
        spec = job_spec(sim_job)
        if self.accounts and spec.account is None and sim_job.user in self.accounts:
            return msgspec.structs.replace(spec, account=self.accounts[sim_job.user])
        return spec

    def run(self) -> None:
        """Steps 2-5 of the module docstring."""
        arrivals, i, n = self.jobs, 0, len(self.jobs)
        ends = self.ends
        while i < n or ends or self.wake is not None:
            now = float(arrivals[i].submit) if i < n else math.inf
            if ends and ends[0][0] < now:
                now = ends[0][0]
            if self.wake is not None and self.wake < now:
                now = self.wake
            while ends and ends[0][0] == now:
                _, job_id, attempt = heapq.heappop(ends)
                self.exit(job_id, attempt, now)
            while i < n and arrivals[i].submit == now:
                job = arrivals[i]
                self.put(ev.JobSubmitted(job_id=job.id, user=job.user, spec=self.spec_of(job)), now)
                i += 1
            self.cycle(now)
        if self.state.active:
            stuck = list(self.state.active)[:5]
            raise SimError(f"the schedule stopped with {len(self.state.active)} jobs pending, e.g. {stuck}")

    def exit(self, job_id: int, attempt: int, now: float) -> None:
        """The batch node reports the end of a run (unless that run already ended: preempted earlier)."""
        job = self.state.jobs[job_id]
        if job.restart_count != attempt or job.state != "RUNNING" or job.run_exit is not None:
            return
        # A preempted run is killed, not timed out, even if it had more to do.
        timed_out = job.preempting is None and self.by_id[job_id].run_time > now - (job.start_time or 0.0)
        # Every node of the run reports its processes gone (the batch node first: its exit is the run's),
        # as the agents do when a run's script ends with its steps.
        for alloc in job.allocations:
            body = ev.RunExited(
                job_id=job_id, attempt=job.restart_count, node=alloc.node, exit_code=0, timed_out=timed_out
            )
            self.put(body, now)

    def cycle(self, now: float) -> None:
        """Plan and apply until a cycle decides nothing new (step 4)."""
        state, policy = self.state, self.policy
        while True:
            self.cycles += 1
            outcome = plan(state, now, policy, cache=self.capacity)
            wake = outcome.wake_at
            self.wake = wake if wake is not None and wake > now else None
            decisions = outcome.decisions
            if not decisions:
                return
            progressed = again = False
            for decision in decisions:
                reaction = REACTIONS.get(type(decision))
                if reaction is None:
                    raise SimError(f"the core decided {decision!r}, which the simulator has no reaction to")
                assert not isinstance(decision, ev.NodeEvent)
                cause = cause_of(state, decision)
                if isinstance(decision, ev.RESERVATION_EVENTS):
                    self.put(decision, now, cause)
                    progressed = True
                    continue
                job = state.jobs[decision.job_id]
                before = job.state
                self.put(decision, now, cause)
                if reaction == "preempt":
                    # The victim stays RUNNING: its run ends after the grace (the preemptor waits for it).
                    if job.preempting is not None and job.preempting.at == now:
                        self.preempted(job, now)
                        progressed = True
                    continue
                progressed = progressed or job.state != before
                if reaction == "start":
                    self.started(job, now)
                elif job.state not in ("PENDING", "RUNNING"):
                    self.ended(job, now)
                    again = again or self.gated
                else:
                    again = True  # requeued, held, released, updated: the next cycle may place it
            if not progressed:
                # The fold refused every decision: planning again would decide the same forever.
                raise SimError(f"at t={now:g} the core's decisions were all refused: {decisions[:3]}")
            if not again:
                return

    def started(self, job: Job, now: float) -> None:
        """A run began: schedule its end (its run time, cut at its time limit)."""
        if job.state != "RUNNING" or job.start_time != now:
            return
        run = self.by_id[job.job_id].run_time
        if job.time_limit_s is not None:
            run = min(run, job.time_limit_s)
        self.starts[job.job_id] = (now, tuple(a.node for a in job.allocations))
        heapq.heappush(self.ends, (now + run, job.job_id, job.restart_count))

    def preempted(self, job: Job, now: float) -> None:
        """A run is being preempted: it exits at the end of its grace, unless it ends before on its own."""
        assert job.preempting is not None and job.start_time is not None
        run = self.by_id[job.job_id].run_time
        if job.time_limit_s is not None:
            run = min(run, job.time_limit_s)
        kill = now + job.preempting.grace_s
        if kill < job.start_time + run:
            heapq.heappush(self.ends, (kill, job.job_id, job.restart_count))

    def ended(self, job: Job, now: float) -> None:
        """A job reached a terminal state: record it."""
        sim_job = self.by_id[job.job_id]
        start, nodes = self.starts.get(job.job_id, (now, ()))
        self.records[job.job_id] = JobRecord(
            sim_job.id, sim_job.submit, start, now, sim_job.units, nodes, job.state
        )


def simulate(
    jobs: Sequence[SimJob], cluster: SimCluster, backfill: Backfill = "easy", window_s: int | None = None
) -> SimResult:
    """Replay ``jobs`` on ``cluster`` with the core's planner; SimError if it cannot be done.

    The policy is the cluster's (its configuration's, if any) with this ``backfill`` mode and
    ``window_s``, which bounds how far ahead reservations are planned (Slurm's bf_window); None, the
    default, plans without bound, as the textbook EASY and conservative algorithms do.
    """
    if cluster.policy is not None:
        policy = dataclasses.replace(cluster.policy, backfill=backfill, backfill_window_s=window_s)
    else:
        policy = Policy(
            partitions=cluster.partitions,
            cluster="sim",
            backfill=backfill,
            backfill_window_s=window_s,
            blocks=dict(cluster.blocks),
        )
    run = _Run(jobs, cluster, policy)
    run.check_fits()
    run.run()
    records = tuple(run.records[j.id] for j in run.jobs)
    return SimResult(records, cluster.capacity, run.cycles)
