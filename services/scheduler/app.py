"""The scheduler service: a thin shell around the pure fold and plan.

Cycle:
1. rebuild: fold the whole log into the state (``state.apply``), from sequence 1;
2. follow: apply every new entry as it arrives, in log order; an entry a fold handler fails on (a poison
   entry), or one that fails to decode or does not belong on its subject, is skipped (it still moves its
   job's sequence: ``fold.skip``), counted (``State.skipped``), dead-lettered once and logged once, never
   fatal;
   The state keeps each job's spec without its script and environment; a launch order gets them back
   from the submission's log entry (recent ones are kept in memory for that);
3. decide: when caught up (and every decision it published has come back), put the per-node orders the
   state needs on the work stream (deterministic message ids), then ``plan()`` if an entry folded since the
   last plan may change what it decides (``replans``: not a run starting, nor this leader's own start,
   conclusion or reason coming back) or on a full pass. A full pass or a takeover, which come on a timer and
   a lease rather than when the follow has read the log, does nothing while the log's newest entry is more
   than ``ORDER_LAG_S`` ahead of the state (``trails_log``): a leader whose reading stalled sends no order
   for a run whose end it has not read;
4. publish: append each decision with the job's last sequence as the expected subject sequence
   (a concurrent intent, e.g. a cancel, makes the append fail and the job is decided again) and the
   event that caused it (``causation.cause_of``), then append the pending reasons that changed
   (``reason_log.reason_changes``: ``JobReasonChanged``, the same way). The orders, the decisions and the
   reasons each go together, pipelined on one connection in their order (``sending.py``);
5. the decisions count only when they come back through the log (step 2).

After each cycle its duration, the queue and the GPUs go to the metrics (``metrics.py``); a job's first
allocation records its wait since submission. Each cycle that plans is a short live span of its own
(``scheduling cycle``, a root span, not in any job's trace) with the jobs it considered and the decisions
and reason changes it made.

Besides, a full pass runs every ``FULL_PASS_S`` and at the next begin time of a pending job
(``Plan.wake_at``), so ``--begin`` jobs start on time without waiting for an event.

Leadership (``leadership.py``, the rules in ``libs/core/lease.py``): only the process holding the lease
plans, publishes and snapshots; it checks its lease before each cycle and each append, and stamps its
epoch on every decision. A standby runs steps 1 and 2 only, so its state is current when it takes over.

Its query verbs (squeue, sinfo, sprio, sshare, scontrol ping and show reservation, and sbatch --test-only
for the gateway) are ``queries.py``'s, answered by leader and standbys alike. Reservation
decisions are appended like job decisions, conditional on the reservation name's subject
(``corral.evt.resv.<name>.>``) not having changed since.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from corral.libs.config.cluster import ClusterConfig
from corral.libs.config.policy import policy_of, scheduler_state
from corral.libs.core import plan as planner
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.fold import apply, skip
from corral.libs.core.reason_log import reason_changes
from corral.libs.core.state import array_tasks
from corral.libs.runtime import telemetry
from corral.libs.runtime.bus import Bus, LogEntry
from corral.libs.runtime.errors import TransientError
from corral.libs.runtime.log_reader import BulkReader, BulkReadError
from corral.libs.runtime.service import either
from corral.schemas import events as ev
from corral.schemas.events import Event
from corral.services.scheduler import snapshot, views
from corral.services.scheduler.leadership import Leadership
from corral.services.scheduler.metrics import SchedulerMetrics
from corral.services.scheduler.owners import Owners
from corral.services.scheduler.planning import FoldGate, cycle_span, gc_paused, plan_paused
from corral.services.scheduler.queries import QueryVerbs
from corral.services.scheduler.replay import replay, slim_verdict
from corral.services.scheduler.sending import Sending, every

T = TypeVar("T")
#: Full specs of this many recent submissions are kept for their launch orders.
RECENT_SPECS = 4096
#: Period of the full scheduling pass when nothing happens.
FULL_PASS_S = 5.0
#: A full pass or a takeover sends nothing from a state this far behind the log's newest entry (trails_log).
ORDER_LAG_S = 60.0
#: The scheduler's dead letters (``corral.dlq.scheduler``): log entries its fold skipped.
DEAD_LETTERS = "scheduler"
#: Decisions whose effect the plan that made them counted already (a start takes its capacity, a conclusion
#: frees it, a reason is what the plan said): one of this process's own, folded as it was decided, asks for no
#: new plan. The others (holds, updates, requeues, ...) are planned again after, as every other entry is.
PLANNED = (ev.JobAllocated, ev.JobCompleted, ev.JobReasonChanged)


class Scheduler(QueryVerbs, Sending):
    """One scheduler process: the leader, or a standby that folds the log and decides nothing (``leader``)."""

    def __init__(
        self,
        bus: Bus,
        config: ClusterConfig,
        epoch: int = 0,
        metrics: SchedulerMetrics | None = None,
        leader: Leadership | None = None,
    ) -> None:
        self.metrics = metrics  # the queue, GPUs, cycles and waits (None: no metrics)
        self.capacity = CapacityCache()  # the nodes' free capacity, kept from one plan to the next
        self.snapshot_every = config.scheduler.snapshot_every
        self.snapshot_seq = 0  # last_seq of the newest snapshot this process knows of
        self.bus = bus
        self.config = config
        self.policy = policy_of(config)
        # sbatch --test-only plans conservatively (a job behind the top of its partition gets its start too,
        # the first ``backfill_depth`` blocked ones ahead of it counted); built once.
        self.will_run_policy = dataclasses.replace(self.policy, backfill="conservative")
        self.state = scheduler_state(config)
        self.leader = leader  # the lease (None: always the leader, with ``epoch``)
        self._epoch = epoch
        self.outlook = planner.Plan()  # the latest cycle's reasons, priorities and planned starts
        self._standby_view: tuple[int, int, planner.Plan] | None = None  # (last_seq, second, plan) of view()
        self.inflight = 0  # highest sequence of a decision we appended
        # An entry folded since the last plan may change what a plan decides (``replans``); a cycle without
        # one only puts orders, unless it is a full pass.
        self.replan = True
        self.order_lag_s = ORDER_LAG_S  # how far behind the log a full pass may still send orders from
        self.dependent: set[int] = set()  # jobs seen pending with a dependency (some may not be any more)
        self.sent: set[str] = set()  # message ids of the needed orders this process put on the work stream
        # Full specs (script, environment) of recent submissions by log sequence, for launch orders: the
        # state keeps slim specs. Older ones are read back from the log (one direct get per launch).
        self.recent_specs: OrderedDict[int, ev.JobSpec] = OrderedDict()
        self.lock = asyncio.Lock()
        self.gate = FoldGate()  # what reads the state in the planning thread holds the fold back
        self.last_plan_s = math.inf  # how long the last plan took (``FoldGate.plan``; none yet: a long one)
        self.log = telemetry.logger()
        self.caught_up = asyncio.Event()
        self.rearm = asyncio.Event()  # set when a cycle moved the next begin time: the ticker re-times
        self.poison: list[tuple[LogEntry, str]] = []  # entries the fold skipped, with the reason, to report
        self.bulk = BulkReader(bus.nc)  # reads the log in bulk for a rebuild
        self.owners = Owners()  # each user's jobs, for the queries that name users
        self.order = views.JobOrder()  # the state's job ids in order, for squeue's pages

    @property
    def epoch(self) -> int:
        """The leader epoch this process's decisions carry."""
        return self._epoch if self.leader is None else self.leader.epoch

    def leading(self) -> bool:
        """True while this process may decide (it holds the lease, by its own clock)."""
        return self.leader is None or self.leader.leading()

    async def aside(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``, which reads the state, in the planning thread (``planning.FoldGate``): the loop goes
        on meanwhile (the lease's renewals above all), and the fold waits until it returns."""
        return await self.gate.run(fn, *args)

    # 1 + 2 -------------------------------------------------------------------------------------
    def apply(self, entry: LogEntry) -> None:
        """Fold one entry, with the slim decoder's verdict (``replay.py``); one that failed to decode (or does
        not belong on its subject) and one a fold handler failed on are skipped by the fold and kept for
        ``report_poison``."""
        entry = slim_verdict(entry)
        if entry.envelope is None:
            self.replan = True
            if skip(self.state, entry.seq, entry.subject).reason == "undecodable":
                self.poison.append((entry, f"not a valid event for its subject: {entry.error}"))
            return
        body = entry.envelope.body
        if type(body) is ev.JobSubmitted and self.caught_up.is_set():
            # (Decoded in full; one the full decoder refused, decoded slim, has no full spec to keep.)
            self.recent_specs[entry.seq] = body.spec
            if len(self.recent_specs) > RECENT_SPECS:
                self.recent_specs.popitem(last=False)
        outcome = apply(self.state, entry.seq, entry.envelope)
        if type(body) is ev.JobSubmitted and outcome.applied:
            tasks = array_tasks(self.state, body.job_id) if body.spec.array is not None else ()
            self.owners.add(self.state, body.user, [task.job_id for task in tasks] or [body.job_id])
        if outcome.reason == "handler_failed":
            self.poisoned(entry, f"a fold handler failed: {outcome.error}")
        job_id = getattr(body, "job_id", None)
        if job_id is not None and (job := self.state.jobs.get(job_id)) is not None and job.spec.dependencies:
            self.dependent.add(job_id)
        if replans(body, outcome.applied, self.epoch) or self._dependencies_pending():
            self.replan = True

    def _dependencies_pending(self) -> bool:
        """Whether a pending job has a dependency (``afterok``, ``singleton`` ...): those are judged from the
        folded state, not from the plan's own starts and ends, so a decision coming back may satisfy one."""
        if self.dependent:
            jobs = self.state.jobs
            self.dependent = {
                j for j in self.dependent if (job := jobs.get(j)) is not None and job.state == "PENDING"
            }
        return bool(self.dependent)

    def poisoned(self, entry: LogEntry, reason: str) -> None:
        """Keep an entry the fold skipped, for ``report_poison``."""
        self.poison.append((entry, reason))

    async def report_poison(self) -> None:
        """Dead-letter the entries the fold skipped, each once, and log each once (a replay that meets an
        entry already in the dead letters, as every restart does, adds no copy and no log line)."""
        poison, self.poison = self.poison, []
        for entry, reason in poison:
            try:
                new = await self.bus.dead_letter_entry(DEAD_LETTERS, entry, reason)
            except TransientError as exc:
                new, reason = True, f"{reason} (not dead-lettered: {exc})"
            if new:
                self.log.error(
                    "skipped a poison log entry",
                    seq=entry.seq,
                    subject=entry.subject,
                    reason=reason,
                    skipped=self.state.skipped,
                )

    async def rebuild(self, use_snapshot: bool = True) -> None:
        """Load the latest usable snapshot (if any), then replay the log after it."""
        started = time.monotonic()
        # The state is millions of small acyclic objects: the cyclic GC would rescan them all, again
        # and again, while they are built. Pause it, then freeze what was built out of its way.
        with gc_paused(freeze=True):
            source, bulk = await self._load(use_snapshot)
        self.owners.rebuild(self.state)
        self.log.info(
            "state rebuilt",
            source=source,
            bulk_read=bulk,
            last_seq=self.state.last_seq,
            jobs=len(self.state.jobs),
            seconds=round(time.monotonic() - started, 3),
        )

    async def _load(self, use_snapshot: bool) -> tuple[str, int]:
        """Where the state came from, and how many entries the bulk reader gave."""
        source = "full replay"
        if use_snapshot:
            loaded, source = await snapshot.load(self.bus)
            if loaded is not None and loaded.usage_policy != self.state.usage_policy:
                loaded, source = None, "the snapshot bills usage differently: full replay"
            elif loaded is not None and loaded.min_job_age_s != self.state.min_job_age_s:
                loaded, source = None, "the snapshot forgets ended jobs at another age: full replay"
            if loaded is not None:
                self.state = loaded
                self.snapshot_seq = loaded.last_seq
        # What the log holds now, in bulk; what comes meanwhile (or all of it, if the bulk read cannot be
        # done here), entry by entry.
        end, first = await self.bus.last_seq(), self.state.last_seq
        try:
            await replay(self.bulk, self.state, end, self.apply, self.poisoned)
        except BulkReadError as exc:
            self.log.warning(
                "bulk read stopped: reading on entry by entry", error=str(exc), seq=self.state.last_seq
            )
        bulk = self.state.last_seq - first
        async for entry in self.bus.read(self.state.last_seq + 1):
            self.apply(entry)
        await self.report_poison()
        return source, bulk

    async def maybe_snapshot(self) -> None:
        """Snapshot every ``snapshot_every`` entries (a failed snapshot only costs a longer restart)."""
        if (
            not self.leading()
            or self.snapshot_every <= 0
            or self.state.last_seq - self.snapshot_seq < self.snapshot_every
        ):
            return
        try:
            size = await snapshot.save(self.bus, self.state, self.aside)
        except Exception as exc:
            self.log.warning("snapshot failed", error=repr(exc))
            return
        self.snapshot_seq = self.state.last_seq
        self.log.info("snapshot saved", last_seq=self.state.last_seq, bytes=size)

    async def follow(self, stop: asyncio.Event) -> None:
        """Apply new entries; decide whenever caught up."""
        self.caught_up.set()
        await self.cycle()
        try:
            async for entry in self.bus.read(self.state.last_seq + 1, follow=True):
                await self.gate.fold_turn()  # (what reads the state in the planning thread first)
                self.apply(entry)
                if self.poison:
                    await self.report_poison()
                if entry.pending == 0:
                    self.gate.caught_up()
                    await self.cycle()
                    await self.maybe_snapshot()
                if stop.is_set():
                    return
        finally:
            self.gate.caught_up()

    # 3 + 4 -------------------------------------------------------------------------------------
    async def cycle(self, full: bool = False) -> None:
        """Send the orders, then plan and publish if an entry folded since the last plan may change what it
        decides, or if ``full`` (the periodic pass, a takeover); a failure is logged and the next cycle tries
        again."""
        try:
            await self._cycle(full)
        except TransientError as exc:
            self.log.warning("cycle interrupted, will retry", error=str(exc))
        except Exception:
            self.log.exception("cycle failed")

    async def _cycle(self, full: bool) -> None:
        if full:
            self.replan = (
                True  # a full pass that finds a cycle running, or decisions out, is the next cycle's
            )
        if self.lock.locked():
            return
        async with self.lock:
            if self.inflight > self.state.last_seq or not self.leading():
                return
            if full and await self.trails_log():
                return  # (the follow cycles once it has read up to the log's end)
            # The orders of what the log already says first: an allocation that came back goes to its
            # node without waiting for this cycle's plan. One that cannot go now is sent by a later cycle;
            # it holds back no plan.
            try:
                await self.send_orders()
            except Exception as exc:
                self.log.warning("orders not all sent, will retry", error=repr(exc))
            if not self.replan:
                if self.metrics is not None:  # the queue and the GPUs as the folded decisions left them
                    self.metrics.cycled(self.state, self.outlook, self.policy, None)
                return
            self.replan = False  # (entries folded while this cycle publishes set it again)
            try:
                await self._plan_and_publish()
            except BaseException:
                self.replan = True  # what it did not publish is decided again
                raise

    async def trails_log(self) -> bool:
        """Whether the log's newest entry is more than ``ORDER_LAG_S`` (by the entries' times) ahead of the
        state: a full pass or a takeover then sends no order and plans nothing. The follow cycles only when
        it has read what the log had, but these come on a timer and a lease, so a leader whose reading
        stalled would send launch orders for runs whose ends it has not read (an agent forgets a run's
        record a week after its exit: ``agent/records.py``). One request, two when the log has more."""
        end = await self.bus.last_seq()
        if end <= self.state.last_seq:
            return False
        newest = (await self.bus.entry(end)).envelope
        if newest is None or newest.meta.occurred_at - self.state.now <= self.order_lag_s:
            return False
        self.log.warning(
            "the state trails the log: no orders until it has read it",
            state_seq=self.state.last_seq,
            log_seq=end,
            behind_s=round(newest.meta.occurred_at - self.state.now, 1),
        )
        return True

    async def _plan_and_publish(self) -> None:
        """Steps 3 and 4: plan, then append the decisions and the reasons that changed."""
        started = time.perf_counter()
        began_ns = time.time_ns()
        args = (self.state, time.time(), self.policy, self.epoch, self.capacity)
        decided, release = await self.gate.plan(self.last_plan_s, plan_paused, *args)  # (on the loop, or not)
        self.last_plan_s = time.perf_counter() - started
        try:
            changes = reason_changes(self.state, decided.reasons, decided.details, self.epoch)
            if decided.wake_at != self.outlook.wake_at:
                self.rearm.set()
            self.outlook = decided
            with cycle_span(began_ns, decided, changes):
                # The sends read their jobs' sequences as they start, before any entry folded since the plan.
                await every((self.publish(decision) for decision in decided.decisions), started=release)
                await every(self.publish(change) for change in changes)
        finally:
            release()
        if self.metrics is not None:
            self.metrics.cycled(self.state, decided, self.policy, time.perf_counter() - started)

    async def ticker(self, stop: asyncio.Event) -> None:
        """A full pass every FULL_PASS_S even when no event arrives, and at the next begin time."""
        while not stop.is_set():
            self.rearm.clear()
            try:
                await asyncio.wait_for(either(stop, self.rearm), self.next_pass_in())
            except TimeoutError:
                if self.caught_up.is_set():
                    await self.cycle(full=True)

    def next_pass_in(self) -> float:
        """Seconds until the next full pass: FULL_PASS_S, or sooner when a begin time comes first."""
        wake = self.outlook.wake_at
        if wake is None:
            return FULL_PASS_S
        # A hair after the begin time, so that the pass sees it as come.
        return min(FULL_PASS_S, max(wake - time.time(), 0.0) + 0.01)


def replans(body: Event, applied: bool, epoch: int) -> bool:
    """Whether folding ``body`` may change what the next plan decides: not a ``RunStarted`` (it only ends
    the need for the run's launch order, which the cycle's orders step reads), nor a decision of ``PLANNED``
    that this epoch's leader made and the fold applied."""
    if type(body) is ev.RunStarted:
        return False
    return not (applied and isinstance(body, PLANNED) and body.epoch == epoch)
