"""The node agent (slurmd): registers its node, heartbeats, and runs the orders for its node.

Cycle:
1. register: append ``NodeRegistered`` with the node's inventory (GPUs from NVML when a driver is present,
   else from the cluster config); a GPU count that does not match the config registers the node drained;
2. reconcile: runs recorded as launched but never reported are re-adopted: each batch script runs under a
   detached supervisor (runner.py, stepd.py) that outlives the agent, so a run still alive is supervised
   again (time limit included) and one that ended meanwhile is reported with its exit status;
3. heartbeat on ``corral.hb.<node>`` every interval (not an event);
4. consume ``corral.work.<node>`` durably, in order: a launch starts the batch script (at most once
   per (job, attempt): the local record makes a redelivery a no-op; a launch older than an attempt
   already seen is refused and reported), a kill starts the kill sequence;
5. report ``RunStarted`` and, when the script ends, ``RunExited``;
6. answer ``srun``'s step requests (``steps.py``).

Stopping the agent (SIGTERM) leaves its jobs running; the next agent process re-adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pwd
import signal
import uuid
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg

from corral.libs.config.cluster import ClusterConfig, NodeConfig
from corral.libs.config.settings import environment
from corral.libs.runtime import telemetry
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.errors import InvalidInput, TransientError
from corral.libs.runtime.service import Context, run_until_stopped
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import DecodeError, decode, encode
from corral.services.agent import confine, inventory, runner
from corral.services.agent.crashpoints import CrashPoints
from corral.services.agent.jobenv import base_environment
from corral.services.agent.records import Record, Records
from corral.services.agent.step_cgroups import StepCgroups
from corral.services.agent.steps import Steps

_tracer = telemetry.tracer(__name__)

#: The launch order of a run, kept in its directory (for steps).
ORDER_FILE = "order.json"

#: RunExited.launch_error of a launch refused because the node already ran a newer attempt of the job.
STALE_ATTEMPT = "stale attempt: this node already ran a newer attempt of the job"


class Agent:
    """The agent of one node."""

    def __init__(
        self,
        bus: Bus,
        config: ClusterConfig,
        node: NodeConfig,
        state_dir: Path,
        detect_gpus: inventory.Detector = inventory.nvml_gpus,
        crash: CrashPoints | None = None,
    ) -> None:
        self.bus = bus
        self.detect_gpus = detect_gpus
        self.crash = crash or CrashPoints()
        self.config = config
        self.node = node
        self.dir = state_dir
        self.records = Records(state_dir / "runs.jsonl")
        self.runs: dict[tuple[int, int], runner.Run] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.steps: Steps | None = None  # the node's step server (srun), attached before reconcile
        login = pwd.getpwuid(os.getuid())
        self.base_env = base_environment(environment(), login.pw_name, login.pw_dir, login.pw_shell)
        self.log = telemetry.logger(node=node.name)
        self.cgroups = confine.RunCgroups.probe(config, node, state_dir, self.log)

    # 1 ------------------------------------------------------------------------------------------
    async def register(self) -> None:
        """Announce the node's inventory."""
        boot = uuid.uuid4().hex
        found = inventory.inventory(self.node, self.detect_gpus)
        if found.drain_reason:
            self.log.warning("registering drained", reason=found.drain_reason)
        await self.bus.append(
            ev.NodeRegistered(
                node=ev.NodeName(self.node.name),
                cpus=self.node.cpus,
                mem_mb=self.node.mem_mb,
                gpus=found.gpus,
                gpu_type=found.gpu_type,
                partitions=self.config.partitions_of(self.node.name),
                features=list(self.node.features),
                boot_id=boot,
                drain_reason=found.drain_reason,
            ),
            msg_id=f"register:{self.node.name}:{boot}",
        )

    # 2 ------------------------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Re-adopt the runs a previous agent process launched and never reported: a run whose supervisor is
        alive is supervised again (time limit included); one that ended while the agent was down is
        reported with its exit status; one whose supervisor vanished without a status is reported killed."""
        unfinished = self.records.unfinished()
        # Cgroups of runs already reported (an agent that died while removing one) go now; those of runs
        # still running here, or that steps' tasks (which outlive the agent) joined, stay.
        keep = {c for r in unfinished if (c := confine.recorded_cgroup(self.run_dir(r.job_id, r.attempt)))}
        in_use = self.steps.cgroups_in_use() if self.steps is not None else set()
        await asyncio.to_thread(self.cgroups.sweep, keep | in_use)  # a removal may wait for a cgroup to empty
        for rec in unfinished:
            run = runner.adopt(
                rec, self.run_dir(rec.job_id, rec.attempt), self.records, self.config.kill_wait_s
            )
            self.log.info("run adopted", job_id=rec.job_id, attempt=rec.attempt, pid=run.pid)
            if not rec.start_reported and run.pid:
                # its launch was cut short after the supervisor started (before RunExited, if it ended)
                await self.report_start(run)
            self._supervise_in_background(run)

    # 3 ------------------------------------------------------------------------------------------
    async def heartbeat(self, stop: asyncio.Event) -> None:
        """Tell health we are alive, every heartbeat interval."""
        subject = subjects.heartbeat_subject(self.node.name)
        while not stop.is_set():
            with contextlib.suppress(Exception):
                await self.bus.nc.publish(subject, b"")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.heartbeat_interval_s)

    # 4 ------------------------------------------------------------------------------------------
    async def handle(self, msgs: list[Msg]) -> None:
        """Execute orders in order (the bus acks after this returns)."""
        for msg in msgs:
            try:
                order = decode(msg.data, api.Order)
            except DecodeError as exc:
                raise InvalidInput(f"malformed order: {exc}") from None
            if order.node != self.node.name:
                raise InvalidInput(f"order for node {order.node} delivered to {self.node.name}")
            if isinstance(order, api.LaunchOrder):
                await self.launch(order)
            elif isinstance(order, api.SignalOrder):
                self.signal(order)
            else:
                await self.kill(order)

    async def launch(self, order: api.LaunchOrder) -> None:
        """Start the batch script once per (job, attempt)."""
        key = (order.job_id, order.attempt)
        if self.records.get(*key) is not None:
            return  # a redelivered order: already done
        if self.records.latest_attempt(order.job_id) > order.attempt:
            # Refused and reported, so the log shows it; the fold ignores the exit of a run that is not the
            # job's current one, so it cannot disturb the newer attempt.
            self.log.warning("refusing launch of a stale attempt", job_id=order.job_id, attempt=order.attempt)
            self.records.put(Record(job_id=order.job_id, attempt=order.attempt))
            await self.report_exit(
                order.job_id, order.attempt, runner.Outcome(1, 0, False, False), STALE_ATTEMPT
            )
            return
        self.records.put(runner.launch_record(order))
        self.crash.reached("launch.recorded")
        with _tracer.start_as_current_span(
            "launch",
            context=telemetry.extract(order.traceparent),
            attributes={
                "corral.job_id": order.job_id,
                "corral.attempt": order.attempt,
                "corral.user": order.user,
                "corral.partition": order.partition,
                "corral.nodes": ",".join(a.node for a in order.allocations),
                "corral.gpus": ",".join(str(g) for g in order.allocations[0].gpus),
            },
        ):
            await self._launch(order, key)

    def run_dir(self, job_id: int, attempt: int) -> Path:
        """Where a run's script, pids and status files live."""
        return self.dir / "jobs" / f"{job_id}.{attempt}"

    async def _launch(self, order: api.LaunchOrder, key: tuple[int, int]) -> None:
        # What steps (srun) need of the run later, even after an agent restart: its launch order; written
        # before the supervisor starts, so that a run adopted after an agent stopped mid-launch has it too.
        with contextlib.suppress(OSError):
            self.run_dir(*key).mkdir(parents=True, exist_ok=True)
            (self.run_dir(*key) / ORDER_FILE).write_bytes(encode(order))
        cgroup = await asyncio.to_thread(self.cgroups.create, order, self.run_dir(*key))
        try:
            run = await runner.start(
                order,
                self.run_dir(*key),
                self.base_env,
                self.records,
                self.config.kill_wait_s,
                cgroup,
                self.crash.reached,
            )
        except runner.LaunchError as exc:
            self.log.warning("launch failed", job_id=order.job_id, error=str(exc))
            await asyncio.to_thread(confine.release, self.run_dir(*key))
            await self.report_exit(order.job_id, order.attempt, runner.Outcome(1, 0, False, False), str(exc))
            return
        # Known as running here before RunStarted is out: srun may ask for a step as soon as it sees it.
        self.runs[run.key] = run
        self.crash.reached("launch.handshake_recorded")
        await self.report_start(run)
        self.crash.reached("launch.started_reported")
        self.log.info("run started", job_id=order.job_id, attempt=order.attempt, pid=run.pid)
        self._supervise_in_background(run)

    async def report_start(self, run: runner.Run) -> None:
        """Append RunStarted (retrying until the log takes it), then record that it was reported."""
        job_id, attempt = run.key
        await self._append(
            ev.RunStarted(
                job_id=ev.JobId(job_id), attempt=attempt, node=ev.NodeName(self.node.name), pid=run.pid
            ),
            msg_id=f"start:{job_id}:{attempt}:{self.node.name}",
        )
        self.records.update(job_id, attempt, start_reported=True)

    def _supervise_in_background(self, run: runner.Run) -> None:
        self.runs[run.key] = run
        run.step_signaller = self._signal_steps_everywhere
        self._spawn(self._supervise(run))

    async def kill(self, order: api.KillOrder) -> None:
        """End everything of a run on this node (after its grace time, for a preemption): its batch script,
        if it runs here, and its steps' tasks, all at once and with the same kill sequence. A run whose
        script this node does not run (a peer's part, or a launch the kill overtook) is reported ended once
        its tasks here are gone: the scheduler gives this node's GPUs to nobody before that."""
        key = (order.job_id, order.attempt)
        grace = self.config.kill_wait_s if order.grace_s is None else order.grace_s
        if self.steps is not None:
            for local_key in [k for k in self.steps.local if k[:2] == key]:
                self.steps.kill_step_here(local_key, grace)
        run = self.runs.get(key)
        if run is not None:
            run.kill(grace_s=order.grace_s)
            return
        if self.records.get(*key) is None:
            self.records.put(Record(job_id=order.job_id, attempt=order.attempt, ending="killed"))
            self._spawn(self._end_here(order.job_id, order.attempt, grace))

    async def _end_here(self, job_id: int, attempt: int, grace: float) -> None:
        """A run this node runs no script of: its tasks here end, then the run is reported gone here."""
        if self.steps is not None:
            await self.steps.end_run(job_id, attempt, grace)
        await self.report_exit(job_id, attempt, runner.Outcome(0, signal.SIGTERM, False, True))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def signal(self, order: api.SignalOrder) -> None:
        """Signal a live run (scancel -s) without ending it, as Slurm does: the tasks of its steps on this
        node (every node of the run gets the order), the batch shell only (``-b``), or the batch shell with
        the processes of the script and the steps' tasks (``-f``). Nothing else: what a batch script started
        without srun gets no signal unless ``-f``. A run not live here gets nothing."""
        run = self.runs.get((order.job_id, order.attempt))
        self.log.info(
            "signal order",
            job_id=order.job_id,
            attempt=order.attempt,
            signal=order.signal,
            scope=order.scope,
            live=run is not None and not run.ended.is_set(),
        )
        if order.scope != "batch" and self.steps is not None:
            self.steps.signal_run(order.job_id, order.attempt, order.signal, everywhere=False)
        if run is None or run.ended.is_set() or order.scope == "steps":
            return
        run.signal(order.signal, batch_only=order.scope == "batch")

    # 5 ------------------------------------------------------------------------------------------
    async def _supervise(self, run: runner.Run) -> None:
        outcome = await run.wait()
        self.runs.pop(run.key, None)
        job_id, attempt = run.key
        if self.steps is not None:
            # The run's exit says that nothing of it is left on this node: its steps' tasks end first.
            await self.steps.end_run(job_id, attempt)
        # Its supervisor removes the run's cgroup; one that vanished (killed) leaves it to us.
        if not await asyncio.to_thread(confine.release, run.run_dir):
            self.log.warning("run cgroup not removed", job_id=job_id, attempt=attempt)
        if not outcome.oom and self.steps is not None and self.steps.had_oom(job_id, attempt):
            # A step's task was OOM-killed on a node of the run: the job ends OUT_OF_MEMORY, as when it
            # happens in the batch node's run cgroup.
            outcome = dataclasses.replace(outcome, oom=True)
        self.log.info("run exited", job_id=job_id, exit_code=outcome.exit_code, signal=outcome.signal)
        await self.report_exit(job_id, attempt, outcome)

    async def report_exit(
        self, job_id: int, attempt: int, outcome: runner.Outcome, launch_error: str | None = None
    ) -> None:
        """Append RunExited (retrying until the log takes it), then record that it was reported."""
        body = ev.RunExited(
            job_id=ev.JobId(job_id),
            attempt=attempt,
            node=ev.NodeName(self.node.name),
            exit_code=outcome.exit_code,
            signal=outcome.signal,
            killed=outcome.killed,
            timed_out=outcome.timed_out,
            launch_error=launch_error,
            oom=outcome.oom,
        )
        await self._append(body, msg_id=f"exit:{job_id}:{attempt}:{self.node.name}")
        if self.records.get(job_id, attempt) is None:
            self.records.put(Record(job_id=job_id, attempt=attempt))
        self.records.update(job_id, attempt, exited=True)

    def remove_peer_cgroup(self, job_id: int, attempt: int) -> None:
        """Remove the run cgroup a peer made for the steps of a run (step_cgroups.py) and its record."""
        run_dir = self.run_dir(job_id, attempt)
        if confine.release(run_dir):
            with contextlib.suppress(OSError):
                (run_dir / confine.CGROUP_FILE).unlink()
                run_dir.rmdir()

    def _signal_steps_everywhere(self, job_id: int, attempt: int, sig: int) -> None:
        """The ``--signal`` warning of a run of this (batch) node: to its steps' tasks on every node."""
        if self.steps is not None:
            self.steps.signal_run(job_id, attempt, sig, everywhere=True)

    def running_order(self, job_id: int) -> api.LaunchOrder | None:
        """The launch order of the job's run running on this node (its batch node), if any: kept in the
        run's directory at launch, so a run this agent re-adopted after a restart has it too. A run whose
        kill sequence has begun (cancel, time limit, requeue, preemption) is not running any more: its steps
        end with it, as cancelled."""
        keys = [key for key in self.runs if key[0] == job_id]
        if not keys or self.runs[max(keys)].rec.ending:
            return None
        try:
            data = (self.run_dir(*max(keys)) / ORDER_FILE).read_bytes()
            order: api.LaunchOrder = decode(data, api.LaunchOrder)
        except (OSError, DecodeError):
            return None
        return order

    async def _append(self, body: ev.Event, msg_id: str | None = None) -> None:
        delay = 0.2
        while True:
            try:
                await self.bus.append(body, msg_id=msg_id)
                return
            except TransientError as exc:
                self.log.warning("append failed, retrying", error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def shutdown(self) -> None:
        """Stop supervising and leave the runs running: their supervisors outlive the agent, and the next
        agent process re-adopts them (reconcile). Nothing is killed, nothing is lost."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def main(ctx: Context) -> None:
    """Register, reconcile, then heartbeat and execute orders until stopped."""
    name = ctx.args.node
    try:
        node = ctx.config.node(name)
    except KeyError:
        raise SystemExit(f"corral-agent: error: node {name!r} is not in {ctx.config.source}") from None
    state_dir = ctx.args.state_dir or ctx.settings.state_dir / "agents" / name
    agent = Agent(ctx.bus, ctx.config, node, Path(state_dir), crash=CrashPoints(ctx.args.crash_at))
    step_server = Steps(
        ctx.bus.nc,
        name,
        Path(state_dir),
        ctx.config.kill_wait_s,
        agent.running_order,
        agent.run_dir,
        agent._append,
        StepCgroups(
            run_cgroup=lambda job_id, attempt: agent.cgroups.of(agent.run_dir(job_id, attempt)),
            create=lambda order: agent.cgroups.create(order, agent.run_dir(order.job_id, order.attempt)),
            remove=agent.remove_peer_cgroup,
        ),
        latest_attempt=agent.records.latest_attempt,
        reached=agent.crash.reached,
    )
    agent.steps = step_server
    await agent.register()
    await agent.reconcile()
    await step_server.start()
    try:
        await run_until_stopped(
            ctx.stop,
            agent.heartbeat(ctx.stop),
            ctx.bus.consume(
                subjects.WORK_STREAM,
                f"agent-{name}",
                subjects.work_subject(name),
                agent.handle,
                service=f"agent-{name}",
                batch=16,
                stop=ctx.stop,
            ),
        )
    finally:
        await step_server.stop()
        await agent.shutdown()
