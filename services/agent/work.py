"""The work consumer of a node: its orders (``corral.work.<node>``), executed in order, and the runs they
start, supervised until their exit is reported.

- reconcile (at start): runs recorded as launched but never reported are re-adopted: each batch script
  runs under a detached supervisor (runner.py, stepd.py) that outlives the agent, so a run still alive
  is supervised again (time limit included) and one that ended meanwhile is reported with its exit status;
  before that, what runs reported ended left behind is swept, then the records of those ended past their
  retention are forgotten and the record file compacted (records.py);
- a launch starts the batch script (at most once per (job, attempt): the local record makes a redelivery a
  no-op; a launch older than an attempt already seen is refused and reported), the run's private TMPDIR
  made first (``runtmp.py``) and removed once the run ended here, before its exit is reported;
- a kill starts the kill sequence of the run's script and its steps' tasks here, at once (on a node that
  runs no script of the run, the run's TMPDIR there goes once they are gone);
- a signal reaches the run's steps' tasks here and/or its batch shell (``scancel -s``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from nats.aio.msg import Msg

from corral.libs.config.cluster import ClusterConfig
from corral.libs.runtime import telemetry
from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.errors import InvalidInput
from corral.libs.runtime.ports import Clock
from corral.schemas import api
from corral.schemas.codec import DecodeError, decode
from corral.services.agent import confine, runner
from corral.services.agent.background import Background
from corral.services.agent.identity import Identities, UnknownIdentity
from corral.services.agent.jobenv import base_environment
from corral.services.agent.records import Record
from corral.services.agent.reporting import Reporter
from corral.services.agent.runs import Runs
from corral.services.agent.runtmp import RunTmp
from corral.services.agent.step_state import CrashPoint

_tracer = telemetry.tracer(__name__)

#: RunExited.launch_error of a launch refused because the node already ran a newer attempt of the job.
STALE_ATTEMPT = "stale attempt: this node already ran a newer attempt of the job"


class RunSteps(Protocol):
    """What the runs need of the node's steps (``steps.py``)."""

    def signal_run(self, job_id: int, attempt: int, sig: int, *, everywhere: bool) -> None:
        """Signal the tasks of every step of a run, here or (batch node) on every node."""

    def kill_run_here(self, job_id: int, attempt: int, grace: float) -> None:
        """Start the kill sequence of this node's tasks of a run's steps."""

    async def end_run(self, job_id: int, attempt: int, grace: float | None = None) -> None:
        """End this node's tasks of a run's steps; return once they are gone."""

    def had_oom(self, job_id: int, attempt: int) -> bool:
        """Whether a step of the run had a task OOM-killed."""

    def cgroups_in_use(self) -> set[str]:
        """The memory cgroups step tasks here joined."""


class Work:
    """Executes the orders of one node and supervises the runs they start."""

    def __init__(
        self,
        node: str,
        config: ClusterConfig,
        runs: Runs,
        reporter: Reporter,
        steps: RunSteps,
        agent_env: Mapping[str, str],
        crash: CrashPoint,
        log: Any,
        clock: Clock | None = None,
        identities: Identities | None = None,
        tmp: RunTmp | None = None,
    ) -> None:
        self.node = node  # this node's name
        self.config = config  # the cluster (KillWait)
        self.runs = runs  # the node's runs table
        self.reporter = reporter  # RunStarted, RunExited
        self.steps = steps  # the node's steps
        self.agent_env = agent_env  # the agent's environment: where the cluster is (jobenv.AGENT_VARIABLES)
        # who each job runs as (its owner, looked up on this node)
        self.identities = identities or Identities(node, config.allow_root_jobs)
        self.crash = crash  # the crash points of a launch (failure tests)
        self.log = log
        self.clock = clock or SystemClock()  # the runs' time limits and warnings (a FakeClock in unit tests)
        self.background = Background()  # the runs' supervision (cancelled at shutdown)
        # each run's TMPDIR here (none without one), and the rest of what the node adds to a job's environment
        self.tmp = tmp or RunTmp(None, "", node, runs.records, log)

    async def reconcile(self) -> None:
        """Re-adopt the runs a previous agent process launched and never reported: a run whose supervisor is
        alive is supervised again (time limit included); one that ended while the agent was down is
        reported with its exit status; one whose supervisor vanished without a status is reported killed."""
        records = self.runs.records
        # TMPDIRs of runs that ended here (an agent that died before removing one) go now.
        if self.tmp.root is not None:
            await asyncio.to_thread(self.tmp.sweep, self.runs.dir)
        await asyncio.to_thread(self.runs.sweep_run_dirs)  # and the directories of runs reported ended
        # Then the records of the runs no order can come for any more go, and the file is rewritten.
        try:
            forgotten = await asyncio.to_thread(records.compact)
            self.log.info("run records compacted", kept=len(records.runs), forgotten=forgotten)
        except OSError as exc:  # (a full disk: the old file stays, whole, and is tried again as it grows)
            self.log.warning("run records not compacted", error=str(exc))
        unfinished = records.unfinished()
        # Cgroups of runs already reported (an agent that died while removing one) go now; those of runs
        # still running here, or that steps' tasks (which outlive the agent) joined, stay.
        keep = {
            c for r in unfinished if (c := confine.recorded_cgroup(self.runs.run_dir(r.job_id, r.attempt)))
        }
        in_use = self.steps.cgroups_in_use()
        await asyncio.to_thread(
            self.runs.cgroups.sweep, keep | in_use
        )  # a removal may wait for a cgroup to empty
        for rec in unfinished:
            run = runner.adopt(
                rec,
                self.runs.run_dir(rec.job_id, rec.attempt),
                records,
                self.config.kill_wait_s,
                self._signal_steps_everywhere,
                self.clock,
            )
            self.log.info("run adopted", job_id=rec.job_id, attempt=rec.attempt, pid=run.pid)
            if not rec.start_reported and run.pid:
                # its launch was cut short after the supervisor started (before RunExited, if it ended)
                await self.reporter.report_start(run)
            self._supervise_in_background(run)

    async def handle(self, msgs: list[Msg]) -> None:
        """Execute orders in order (the bus acks after this returns)."""
        for msg in msgs:
            try:
                order = decode(msg.data, api.Order)
            except DecodeError as exc:
                raise InvalidInput(f"malformed order: {exc}") from None
            if order.node != self.node:
                raise InvalidInput(f"order for node {order.node} delivered to {self.node}")
            if isinstance(order, api.LaunchOrder):
                await self.launch(order)
            elif isinstance(order, api.SignalOrder):
                self.signal(order)
            else:
                await self.kill(order)

    async def launch(self, order: api.LaunchOrder) -> None:
        """Start the batch script once per (job, attempt)."""
        records = self.runs.records
        key = (order.job_id, order.attempt)
        if records.get(*key) is not None:
            return  # a redelivered order: already done
        if records.latest_attempt(order.job_id) > order.attempt:
            # Refused and reported, so the log shows it; the fold ignores the exit of a run that is not the
            # job's current one, so it cannot disturb the newer attempt.
            self.log.warning("refusing launch of a stale attempt", job_id=order.job_id, attempt=order.attempt)
            records.put(
                Record(
                    job_id=order.job_id,
                    attempt=order.attempt,
                    traceparent=order.traceparent,
                    cause_id=order.cause_id or "",
                )
            )
            await self.reporter.report_exit(
                order.job_id, order.attempt, runner.Outcome(1, 0, False, False), STALE_ATTEMPT
            )
            return
        await records.record(runner.launch_record(order, self.clock.now()))
        self.crash.reached("launch.recorded")
        with (
            telemetry.about_job(order.job_id, order.traceparent),
            _tracer.start_as_current_span(
                "launch",
                context=telemetry.extract(order.traceparent),
                attributes={
                    "corral.job.id": order.job_id,
                    "corral.attempt": order.attempt,
                    "enduser.id": order.user,
                    "corral.partition": order.partition,
                    "host.name": self.node,
                    "corral.nodes": [a.node for a in order.allocations],
                    "corral.gpu.indices": list(order.allocations[0].gpus),
                },
            ),
        ):
            await self._launch(order, key)

    async def _launch(self, order: api.LaunchOrder, key: tuple[int, int]) -> None:
        # What steps (srun) need of the run later, even after an agent restart: its launch order; written
        # before the supervisor starts, so that a run adopted after an agent stopped mid-launch has it too.
        self.runs.keep_order(order)
        run_dir = self.runs.run_dir(*key)
        try:
            # the owner first: a user this node cannot run as runs nothing, not even a cgroup
            owner = await asyncio.to_thread(self.identities.of, order.user)
        except UnknownIdentity as exc:
            await self._launch_failed(order, run_dir, str(exc))
            return
        cgroup = await asyncio.to_thread(self.runs.create_cgroup, order)
        node_env = self.tmp.env  # the run's TMPDIR, if runs have one, is made first
        if self.tmp.root is not None:
            node_env = await asyncio.to_thread(self.tmp.node_env, order.job_id, order.attempt, owner)
        try:
            run = await runner.start(
                order,
                run_dir,
                base_environment(self.agent_env, owner.name, owner.home, owner.shell),
                self.runs.records,
                self.config.kill_wait_s,
                cgroup,
                self.crash.reached,
                self._signal_steps_everywhere,
                self.clock,
                owner=owner,
                supervisors=self.runs.supervisors,
                node=node_env,
            )
        except runner.LaunchError as exc:
            await self._launch_failed(order, run_dir, str(exc))
            return
        # Known as running here before RunStarted is out: srun may ask for a step as soon as it sees it.
        self.runs.live[run.key] = run
        self.crash.reached("launch.handshake_recorded")
        await self.reporter.report_start(run)
        self.crash.reached("launch.started_reported")
        self.log.info("run started", job_id=order.job_id, attempt=order.attempt, pid=run.pid)
        self._supervise_in_background(run)

    async def _launch_failed(self, order: api.LaunchOrder, run_dir: Path, why: str) -> None:
        """A launch that could not start the script: its cgroup goes, its exit says why (the job's Reason)."""
        self.log.warning("launch failed", job_id=order.job_id, error=why)
        await asyncio.to_thread(confine.release, run_dir)
        await self._remove_tmp(order.job_id, order.attempt)
        await self.reporter.report_exit(order.job_id, order.attempt, runner.Outcome(1, 0, False, False), why)
        await asyncio.to_thread(self.runs.remove_run_dir, order.job_id, order.attempt)

    def _supervise_in_background(self, run: runner.Run) -> None:
        self.runs.live[run.key] = run
        self.background.spawn(self._supervise(run))

    async def kill(self, order: api.KillOrder) -> None:
        """End everything of a run on this node (after its grace time, for a preemption): its batch script,
        if it runs here, and its steps' tasks, all at once and with the same kill sequence. A run whose
        script this node does not run (a peer's part, or a launch the kill overtook) is reported ended once
        its tasks here are gone: the scheduler gives this node's GPUs to nobody before that."""
        key = (order.job_id, order.attempt)
        grace = self.config.kill_wait_s if order.grace_s is None else order.grace_s
        self.steps.kill_run_here(order.job_id, order.attempt, grace)
        run = self.runs.live.get(key)
        if run is not None:
            run.kill(grace_s=order.grace_s)
            return
        if self.runs.records.get(*key) is None:
            self.runs.records.put(
                Record(
                    job_id=order.job_id,
                    attempt=order.attempt,
                    ending="killed",
                    traceparent=order.traceparent,
                    cause_id=order.cause_id or "",
                )
            )
            self.background.spawn(self._end_here(order.job_id, order.attempt, grace))

    async def _end_here(self, job_id: int, attempt: int, grace: float) -> None:
        """A run this node runs no script of: its tasks here end, then the run is reported gone here."""
        await self.steps.end_run(job_id, attempt, grace)
        await self._remove_tmp(job_id, attempt)
        await self.reporter.report_exit(job_id, attempt, runner.Outcome(0, signal.SIGTERM, False, True))

    def signal(self, order: api.SignalOrder) -> None:
        """Signal a live run (scancel -s) without ending it, as Slurm does: the tasks of its steps on this
        node (every node of the run gets the order), the batch shell only (``-b``), or the batch shell with
        the processes of the script and the steps' tasks (``-f``). Nothing else: what a batch script started
        without srun gets no signal unless ``-f``. A run not live here gets nothing."""
        run = self.runs.live.get((order.job_id, order.attempt))
        self.log.info(
            "signal order",
            job_id=order.job_id,
            attempt=order.attempt,
            signal=order.signal,
            scope=order.scope,
            live=run is not None and not run.ended.is_set(),
        )
        if order.scope != "batch":
            self.steps.signal_run(order.job_id, order.attempt, order.signal, everywhere=False)
        if run is None or run.ended.is_set() or order.scope == "steps":
            return
        run.signal(order.signal, batch_only=order.scope == "batch")

    async def _supervise(self, run: runner.Run) -> None:
        outcome = await run.wait()
        self.runs.live.pop(run.key, None)
        job_id, attempt = run.key
        # The run's exit says that nothing of it is left on this node: its steps' tasks end first.
        await self.steps.end_run(job_id, attempt)
        # Its supervisor removes the run's cgroup; one that vanished (killed) leaves it to us.
        if not await asyncio.to_thread(confine.release, run.run_dir):
            self.log.warning("run cgroup not removed", job_id=job_id, attempt=attempt)
        await self._remove_tmp(job_id, attempt)  # nothing of the run is left to use it
        if not outcome.oom and self.steps.had_oom(job_id, attempt):
            # A step's task was OOM-killed on a node of the run: the job ends OUT_OF_MEMORY, as when it
            # happens in the batch node's run cgroup.
            outcome = dataclasses.replace(outcome, oom=True)
        self.log.info("run exited", job_id=job_id, exit_code=outcome.exit_code, signal=outcome.signal)
        await self.reporter.report_exit(job_id, attempt, outcome)
        await asyncio.to_thread(self.runs.remove_run_dir, job_id, attempt)

    async def _remove_tmp(self, job_id: int, attempt: int) -> None:
        """Remove the run's TMPDIR here, if runs have one (in a thread: it may hold many files)."""
        if self.tmp.path(job_id, attempt) is not None:
            await asyncio.to_thread(self.tmp.remove, job_id, attempt)

    def _signal_steps_everywhere(self, job_id: int, attempt: int, sig: int) -> None:
        """The ``--signal`` warning of a run of this (batch) node: to its steps' tasks on every node."""
        self.steps.signal_run(job_id, attempt, sig, everywhere=True)

    async def shutdown(self) -> None:
        """Stop supervising and leave the runs running: their supervisors outlive the agent, and the next
        agent process re-adopts them (reconcile). Nothing is killed, nothing is lost."""
        await self.background.cancel()
