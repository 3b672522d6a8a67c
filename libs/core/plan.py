"""The scheduling cycle: ``plan(state, now, policy) -> Plan``.

Pure: the shell publishes the returned decisions and only then considers them applied, when they
come back through the log and ``state.apply`` folds them. One cycle (``plan``), in order:

1. ``conclude.conclude``: conclude runs whose batch script exited (COMPLETED, FAILED, TIMEOUT, OUT_OF_MEMORY,
   CANCELLED; a preempted run is requeued or PREEMPTED) or that lost a node (requeued if the job allows
   it, NODE_FAIL otherwise; ``conclude.py``); cancel pending jobs whose cancel was requested; answer hold,
   release and update requests (``JobHeld``, ``JobReleased``, ``JobUpdated``: one decision per job and
   cycle, and such a job is not placed in the same cycle);
2. answer advance reservation requests (``reservations.answer_requests``);
3. ``_capacity``: every node's capacity now (runs concluded in step 1 give theirs back) and over time:
   each run gives its resources back at its start + time limit (a run being preempted at the end of its
   grace time), and a live advance reservation holds its nodes (or GPUs) from outsiders over its window
   (with a ``CapacityCache``, from the nodes' plans it keeps across cycles: ``capacity.py``; what the
   cycle changes in them is undone at its end, ``Planner.restore``);
4. ``Cycle.consider`` each pending job in queue order (``priority.queue_order``): first the gates, each
   stopping the job with its reason; a job a gate stops blocks nobody and gets no reservation (what
   depends on a job's spec alone, its partition's limits among it, is asked once per spec:
   ``job_facts.py``):

   - ``ineligible``: held, a dependency not met, its begin time not come (``eligibility.py``);
     ``Plan.wake_at`` is the next begin time, for the shell to plan again then;
   - ``array_task_limit``: a task of a job array that already runs its ``%P`` tasks (counting those
     started earlier in the cycle, not those concluded in it): ``JobArrayTaskLimit``;
   - ``held_back``: a QOS or association limit (``limits.py``: counts of the running jobs, kept current
     as the cycle starts jobs), with Slurm's reason (``QOSMaxGRESPerUser``, ``AssocGrpGRES``, ...);
   - ``named_nodes_down``: a node it names (``-w``) is down or drained: ``ReqNodeNotAvail``;
   - ``behind_blocked`` (FIFO): behind its partition's first job that could not start: ``Priority``;

5. then the steps, for a job through the gates:

   - ``start_in_reservation``: a job that asks for an advance reservation (``--reservation``) is placed
     only inside it, or waits there (``reservations.py``) blocking nobody outside;
   - ``start``: place it now through the backfill planner (``backfill.py``) if it fits without delaying
     a job with a reservation;
   - ``block``: otherwise it waits: ``Resources`` if it is its partition's first job to, ``Priority``
     behind it, so small jobs cannot starve a large one (``ReqNodeNotAvail`` for the first while a MAINT
     reservation holds nodes of the partition);
   - ``preempt`` (``preempt.py``, with preemption on): the partition's first blocked job preempts a
     minimal set of runs it may preempt (``JobPreempted``) if that makes it fit now; a run being
     preempted is concluded (requeued, or PREEMPTED) once its exit is reported;
   - ``reserve``: the blocked job gets its planned start (``Plan.starts``) while its partition has
     reservations left: none with FIFO, one with EASY, with conservative backfill every blocked job's up
     to the policy's ``backfill_depth`` (``Policy.depth``).

The per-node work the state still needs (launches, kills, signals) is derived apart, in ``orders.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec

from corral.libs.core import preempt, reservations
from corral.libs.core.backfill import Planner
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.conclude import conclude
from corral.libs.core.eligibility import Singletons, needs_check, pending_reason
from corral.libs.core.job_facts import FactsCache
from corral.libs.core.limits import Limits, concluded_runs
from corral.libs.core.placement import Request, unavailable_nodes
from corral.libs.core.policy import Policy
from corral.libs.core.priority import queue_order
from corral.libs.core.reasons import MAINTENANCE, PendingReason, text, unavailable
from corral.libs.core.state import Job, State
from corral.libs.core.timeline import INF
from corral.libs.core.topology import in_force, switch_deadline
from corral.libs.slurm import hostlist
from corral.schemas import events as ev


@dataclass
class Plan:
    """A cycle's output: decisions to append, and facts for squeue."""

    decisions: list[ev.Event] = field(default_factory=list)  # in the order to append them
    reasons: dict[int, PendingReason] = field(default_factory=dict)  # pending reason by job id
    details: dict[int, str] = field(default_factory=dict)  # what squeue shows after a reason, by job id
    priorities: dict[int, int] = field(default_factory=dict)  # priority of each pending job
    starts: dict[int, float] = field(default_factory=dict)  # planned start of jobs with a reservation
    wake_at: float | None = None  # the earliest future begin time or --switches lapse (plan again then)
    at: float | None = None  # when this plan was made (scontrol's LastSchedEval=); None = no plan yet

    def wake(self, when: float | None) -> None:
        """Ask the shell to plan again at ``when`` (the earliest such time wins)."""
        if when is not None and (self.wake_at is None or when < self.wake_at):
            self.wake_at = when

    def reason_text(self, job_id: int, default: PendingReason = "Priority") -> str:
        """A pending job's reason as squeue shows it (``default`` for a job this plan has no reason for)."""
        return text(self.reasons.get(job_id, default), self.details.get(job_id, ""))


def plan(
    state: State,
    now: float,
    policy: Policy,
    epoch: int = 0,
    cache: CapacityCache | None = None,
    until: int | None = None,
) -> Plan:
    """Decide what happens next. Deterministic in (state, now, policy, epoch); ``cache``, kept by the caller
    from one cycle to the next, only saves building the capacity of the nodes that did not change.

    ``until``, for an estimate (``will_run``): the queue is planned up to that job, which gets its planned
    start whatever the reservation depth (``Cycle.last``); the jobs after it are not considered."""
    out = Plan(at=now)
    pending, running = conclude(state, out.decisions)
    if state.resv_requests:
        out.decisions.extend(reservations.answer_requests(state, now, policy.default_partition))
    cycle = Cycle(state, now, policy, out, epoch, running, cache)
    try:
        order = queue_order(state, now, policy, pending, cycle.facts)
        if until is None:
            for job, priority in order:
                cycle.consider(job, priority)
        else:
            for job, priority in order:
                if job.job_id == until:
                    cycle.last(job, priority)
                    break
                cycle.consider(job, priority)
    finally:
        cycle.planner.restore()  # the nodes' plans are the cache's: the next cycle starts from the state's
    # Every decision carries the leader's epoch (the folds' fence, ``lifecycle.DECISIONS``), stamped once.
    if epoch:
        out.decisions = [msgspec.structs.replace(d, epoch=epoch) for d in out.decisions]
    return out


class Cycle:
    """Steps 3 to 5 of the module docstring: the capacity of the cycle, and each pending job through the
    gates and steps in order (``consider``), recording what it decides in the cycle's ``Plan``.

    Built after the conclusions and answers are in ``out``: they free resources and spare their jobs.
    """

    def __init__(
        self,
        state: State,
        now: float,
        policy: Policy,
        out: Plan,
        epoch: int,
        running: list[Job],
        cache: CapacityCache | None = None,
    ) -> None:
        self.state, self.now, self.policy, self.out, self.epoch = state, now, policy, out, epoch
        live = reservations.live(state, now) if state.reservations else []
        # Every node's capacity now and over time, from the running jobs (``conclude``'s).
        self.planner = _capacity(state, now, policy, live, running, cache)
        self.maint = reservations.maint_nodes(live, now)  # nodes a MAINT reservation holds now
        self.window = INF if policy.backfill_window_s is None else float(policy.backfill_window_s)
        self.depth = policy.depth  # reservations per partition (None: every blocked job)
        self.fifo = self.depth == 0  # the first blocked job of a partition stops the ones behind it
        self.blocked: set[str] = set()  # partitions with a job that could not start (FIFO stops there)
        self.reserved: dict[str, int] = {}  # reservations planned per partition (preemptions count)
        self.singletons = Singletons(state)  # for ``singleton`` dependencies (built on first use)
        self.array_running = _array_running(state, out)  # running tasks per job array, kept current
        self.limits = Limits.of(state, policy, concluded_runs(out.decisions))  # None: no limit configured
        self.preempting = policy.preempt.preempt_type != "off"
        self.draining = preempt.draining_for(state) if self.preempting else set()  # their victims still end
        # Jobs concluded in this cycle are not preempted in it (nor twice by two preemptors).
        self.spared = set(_decided_jobs(out.decisions))
        self.facts = FactsCache() if cache is None else cache.facts  # each job's ``Facts``
        self.facts.keep(len(state.active))
        # (partition, request, planned duration, exact limit) of a job that could not start now, once its
        # partition is blocked and has no reservation left to give: a later job asking the same in the cycle
        # waits for ``Priority`` without the calls. Capacity only shrinks and holds only grow as a cycle goes
        # on, so it could not start either; it is not its partition's first to wait (no preemption, no
        # maintenance reason), and gets no reservation. Not for a request of no CPU (``start_now`` puts
        # deferred holds on for it) nor one with ``--switches`` (its wake time).
        self.refused: set[tuple[str, Request, float, int | None]] = set()

    def consider(self, job: Job, priority: int) -> None:
        """One pending job, in queue order: the gates (the first that stops it gives its reason; it then
        blocks nobody and gets no reservation), then start it, or block, preempt for it and reserve."""
        self.out.priorities[job.job_id] = 0 if job.held else priority
        facts = self.facts.of(job, self.policy)  # what depends on its spec alone (``job_facts.py``)
        partition = facts.partition
        if facts.plain and not job.held and self.limits is None:
            if facts.refusal in self.refused:  # (known once its request was: ``refused`` below), at once
                self.out.reasons[job.job_id] = "Priority"
                return
            reason = self.behind_blocked(job, partition)  # every other gate lets a plain job through
        else:
            reason = (
                self.ineligible(job)
                or facts.over_partition  # its partition's limits (``job_facts.partition_limits``)
                or self.array_task_limit(job, facts.throttle)
                or self.held_back(job)
                or self.named_nodes_down(job)
                or self.behind_blocked(job, partition)
            )
        if reason is not None:
            self.out.reasons[job.job_id] = reason
            return
        shape = facts.placed(job, self.policy)  # (partition, request, time limit as the plan counts it)
        _, req, limit = shape
        if req.switches is not None:
            req = in_force(req, job, self.now, self.policy.max_switch_wait_s)
            shape = (partition, req, limit)
        limit_s = facts.limit_s
        if job.spec.reservation is not None:
            self.start_in_reservation(job, partition, req, limit_s, limit)
            return
        refusal = (*shape, limit_s)  # the planned duration, and the exact limit a start ends by
        if refusal in self.refused:
            self.out.reasons[job.job_id] = "Priority"  # what ``start``, ``block`` and ``reserve`` would say
            return
        if self.start(job, partition, req, limit_s):
            return
        first = self.block(job, partition, req)
        if first and self.preempt(job, partition, req):
            return
        self.reserve(job, partition, req, limit)
        exhausted = self.depth is not None and self.reserved.get(partition, 0) >= self.depth
        if exhausted and req.cpus >= 1 and req.switches is None:
            self.refused.add(refusal)

    def last(self, job: Job, priority: int) -> None:
        """The last job a plan considers (``plan``'s ``until``): as ``consider``, but if it gets as far as a
        reservation it gets its planned start even past its partition's reservation depth (a request refused
        earlier is asked again); the gates, FIFO's among them, stop it as in the cycle."""
        self.depth = None
        self.refused = set()
        self.consider(job, priority)

    # --- gates: each returns the reason that stops the job now, or None ---------------------------------

    def ineligible(self, job: Job) -> PendingReason | None:
        """Held, a dependency not met, or its begin time not come (``eligibility.py``)."""
        if not needs_check(job):
            return None
        begin = job.spec.begin_time
        if begin is not None and begin > self.now:
            self.out.wake(begin)
        return pending_reason(self.state, job, self.now, self.singletons)

    def array_task_limit(self, job: Job, throttle: int) -> PendingReason | None:
        """A task of an array that already runs its ``%P`` tasks (``throttle``; those the cycle started
        count)."""
        if throttle and self.array_running.get(job.array_job_id, 0) >= throttle:
            return "JobArrayTaskLimit"
        return None

    def held_back(self, job: Job) -> PendingReason | None:
        """A QOS or association limit the job would exceed by starting now (``limits.py``)."""
        return self.limits.reason(job) if self.limits is not None else None

    def named_nodes_down(self, job: Job) -> PendingReason | None:
        """A node the job names (``-w``) is down or drained: it waits until it is back."""
        if not job.spec.nodelist:
            return None
        missing = unavailable_nodes(self.state, job)
        if not missing:
            return None
        self.out.details[job.job_id] = unavailable(hostlist.compress(missing))
        return "ReqNodeNotAvail"

    def behind_blocked(self, job: Job, partition: str) -> PendingReason | None:
        """FIFO: a job behind the first of its partition that could not start (a reservation's member
        is placed inside its reservation, so nobody outside blocks it)."""
        if self.fifo and partition in self.blocked and job.spec.reservation is None:
            return "Priority"
        return None

    # --- steps --------------------------------------------------------------------------------------------

    def start_in_reservation(
        self, job: Job, partition: str, req: Request, limit_s: int | None, limit: float
    ) -> None:
        """A member of an advance reservation starts inside it, or waits without blocking anyone."""
        exact = INF if limit_s is None else float(limit_s)
        placed = reservations.start_member(
            self.planner, self.state, job, partition, req, limit, self.now, exact
        )
        if not isinstance(placed, str):
            self.allocate(job, partition, placed, limit_s)
            return
        self.out.reasons[job.job_id] = placed
        resv = self.state.reservations.get(job.spec.reservation or "")
        if placed == "Reservation" and resv is not None and resv.start_time > self.now:
            self.out.wake(resv.start_time)  # plan again when its window opens

    def start(self, job: Job, partition: str, req: Request, limit_s: int | None) -> bool:
        """Start the job now if it fits without delaying a job with a reservation (``backfill.py``), planned
        to end at its exact limit on the grid (``timeline.release_at``)."""
        allocation = self.planner.start_now(partition, req, INF if limit_s is None else float(limit_s))
        if allocation is None:
            return False
        self.allocate(job, partition, allocation, limit_s)
        return True

    def allocate(
        self, job: Job, partition: str, allocation: list[ev.NodeAllocation], limit_s: int | None
    ) -> None:
        """Decide the start (``JobAllocated``); count it for its array's ``%P`` and its limits."""
        self.out.decisions.append(
            ev.JobAllocated(
                job_id=job.job_id,
                attempt=job.restart_count,
                partition=partition,
                allocations=allocation,
                time_limit_s=limit_s,
                epoch=self.epoch,
            )
        )
        if job.array_job_id:
            self.array_running[job.array_job_id] = self.array_running.get(job.array_job_id, 0) + 1
        if self.limits is not None:
            self.limits.started(job, allocation)

    def block(self, job: Job, partition: str, req: Request) -> bool:
        """The job does not fit now: ``Resources`` if it is its partition's first to wait (then it blocks
        the partition and may preempt), ``Priority`` behind that one; True for the first."""
        top = partition not in self.blocked
        self.out.reasons[job.job_id] = "Resources" if top else "Priority"
        if self.maint and top and any(n in self.maint for n in self.planner.nodes_of(partition)):
            self.out.reasons[job.job_id] = "ReqNodeNotAvail"
            self.out.details[job.job_id] = MAINTENANCE
        if req.switches is not None:
            self.out.wake(switch_deadline(job, self.policy.max_switch_wait_s))  # when --switches lapses
        self.blocked.add(partition)
        return top

    def preempt(self, job: Job, partition: str, req: Request) -> bool:
        """With preemption on, the partition's first blocked job has a minimal set of runs it may preempt
        preempted (``preempt.py``), if that lets it fit now; True if it did."""
        if not self.preempting or job.job_id in self.draining:
            return False
        members = (n.free for n in self.planner.members(partition))
        victims = preempt.preempt_for(self.state, self.policy, job, req, members, self.spared, self.epoch)
        if not victims:
            return False
        # Its reservation comes once these decisions are folded (the victims' ends are then known).
        self.out.decisions.extend(victims)
        self.spared.update(v.job_id for v in victims)
        self.reserved[partition] = self.reserved.get(partition, 0) + 1
        return True

    def reserve(self, job: Job, partition: str, req: Request, limit: float) -> None:
        """Plan the blocked job's earliest start within the window (``Plan.starts``), while its partition
        has reservations left (``Policy.depth``): none with FIFO, one with EASY, ``backfill_depth`` with
        conservative."""
        count = self.reserved.get(partition, 0)
        if self.depth is not None and count >= self.depth:
            return
        self.reserved[partition] = count + 1
        start = self.planner.reserve(partition, req, limit, self.window)
        if start is not None:
            self.out.starts[job.job_id] = start


def _capacity(
    state: State,
    now: float,
    policy: Policy,
    live: list[ev.ReservationCreated],
    running: list[Job],
    cache: CapacityCache | None = None,
) -> Planner:
    """Step 3: the planner over the nodes that are up, with what is free now, when each run gives its
    resources back, and the holds of the live advance reservations (``capacity.CapacityCache.capacity``)."""
    resolution = policy.backfill_resolution_s
    free, nodes = (cache or CapacityCache(follow=False)).capacity(state, running, resolution)
    views = None if cache is None else cache.views()  # the partitions' views of ``nodes``, kept too
    planner = Planner(free, now, policy.blocks, resolution, nodes, cache is not None, views)
    reservations.hold(planner, state, live)
    return planner


def _decided_jobs(decisions: list[ev.Event]) -> Iterator[int]:
    """Ids of the jobs a cycle's decisions are about (reservation decisions are about none)."""
    for decision in decisions:
        if not isinstance(decision, ev.NodeEvent | ev.ReservationEvent):
            yield decision.job_id


def _array_running(state: State, out: Plan) -> dict[int, int]:
    """Running tasks of each job array once this cycle's conclusions (already in ``out``) are applied."""
    running = dict(state.array_running)
    if not running:
        return running
    for job_id in _decided_jobs(out.decisions):
        job = state.jobs[job_id]
        if job.state == "RUNNING" and job.array_job_id in running:
            running[job.array_job_id] -= 1
    return running
