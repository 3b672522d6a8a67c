"""The node agent (slurmd): registers its node, heartbeats, and runs the orders for its node.

Cycle:
1. register: append ``NodeRegistered`` with the node's inventory (from the cluster config);
2. reconcile: runs recorded as launched but never reported are killed if still alive and reported
   ``killed``, so the scheduler requeues them (the agent cannot supervise what it did not start);
3. heartbeat on ``corral.hb.<node>`` every interval (not an event);
4. consume ``corral.work.<node>`` durably, in order: a launch starts the batch script (at most once
   per (job, attempt): the local record makes a redelivery a no-op; a launch older than an attempt
   already seen is refused), a kill starts the kill sequence;
5. report ``RunStarted`` and, when the script ends, ``RunExited``;
6. answer ``srun``'s step requests (``steps.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from pathlib import Path

from nats.aio.msg import Msg

from corral.libs import telemetry
from corral.libs.bus import Bus
from corral.libs.config import ClusterConfig, NodeConfig
from corral.libs.errors import InvalidInput, TransientError
from corral.libs.service import Context
from corral.libs.settings import environment
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.schemas.codec import DecodeError, decode
from corral.services.agent import runner
from corral.services.agent.records import Record, Records
from corral.services.agent.steps import Steps

_tracer = telemetry.tracer(__name__)


class Agent:
    """The agent of one node."""

    def __init__(self, bus: Bus, config: ClusterConfig, node: NodeConfig, state_dir: Path) -> None:
        self.bus = bus
        self.config = config
        self.node = node
        self.dir = state_dir
        self.records = Records(state_dir / "runs.jsonl")
        self.runs: dict[tuple[int, int], runner.Run] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.base_env = environment()
        self.log = telemetry.logger(node=node.name)

    # 1 ------------------------------------------------------------------------------------------
    async def register(self) -> None:
        """Announce the node's inventory."""
        boot = uuid.uuid4().hex
        await self.bus.append(
            ev.NodeRegistered(
                node=ev.NodeName(self.node.name),
                cpus=self.node.cpus,
                mem_mb=self.node.mem_mb,
                gpus=self.node.gpus,
                gpu_type=self.node.gpu_type,
                partitions=self.config.partitions_of(self.node.name),
                features=list(self.node.features),
                boot_id=boot,
            ),
            msg_id=f"register:{self.node.name}:{boot}",
        )

    # 2 ------------------------------------------------------------------------------------------
    async def reconcile(self) -> None:
        """Report runs a previous agent process launched and never reported."""
        for rec in self.records.unfinished():
            if rec.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(rec.pid, signal.SIGKILL)
            await self.report_exit(rec.job_id, rec.attempt, runner.Outcome(0, signal.SIGKILL, False, True))

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
                order = decode(msg.data, api.LaunchOrder | api.KillOrder)
            except DecodeError as exc:
                raise InvalidInput(f"malformed order: {exc}") from None
            if order.node != self.node.name:
                raise InvalidInput(f"order for node {order.node} delivered to {self.node.name}")
            if isinstance(order, api.LaunchOrder):
                await self.launch(order)
            else:
                await self.kill(order)

    async def launch(self, order: api.LaunchOrder) -> None:
        """Start the batch script once per (job, attempt)."""
        key = (order.job_id, order.attempt)
        if self.records.get(*key) is not None:
            return  # a redelivered order: already done
        if self.records.latest_attempt(order.job_id) > order.attempt:
            self.log.warning("refusing launch of a stale attempt", job_id=order.job_id, attempt=order.attempt)
            return
        self.records.put(Record(job_id=order.job_id, attempt=order.attempt))
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

    async def _launch(self, order: api.LaunchOrder, key: tuple[int, int]) -> None:
        run_dir = self.run_dir(order.job_id, order.attempt)
        try:
            run = await runner.start(order, run_dir, self.base_env, self.config.kill_wait_s)
        except runner.LaunchError as exc:
            self.log.warning("launch failed", job_id=order.job_id, error=str(exc))
            await self.report_exit(order.job_id, order.attempt, runner.Outcome(1, 0, False, False), str(exc))
            return
        self.records.put(Record(job_id=order.job_id, attempt=order.attempt, pid=run.pid))
        self.runs[key] = run
        await self._append(
            ev.RunStarted(
                job_id=ev.JobId(order.job_id),
                attempt=order.attempt,
                node=ev.NodeName(self.node.name),
                pid=run.pid,
            )
        )
        self.log.info("run started", job_id=order.job_id, attempt=order.attempt, pid=run.pid)
        task = asyncio.create_task(self._supervise(run))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def kill(self, order: api.KillOrder) -> None:
        """Kill a run (after its grace time, for a preemption); a run this node never started is reported as
        ended at once."""
        key = (order.job_id, order.attempt)
        run = self.runs.get(key)
        if run is not None:
            run.kill(grace_s=order.grace_s)
            return
        rec = self.records.get(*key)
        if rec is None:
            # Never launched here (the kill overtook nothing): record and report it so nobody waits.
            self.records.put(Record(job_id=order.job_id, attempt=order.attempt, exited=False))
            await self.report_exit(
                order.job_id, order.attempt, runner.Outcome(0, signal.SIGTERM, False, True)
            )

    # 5 ------------------------------------------------------------------------------------------
    async def _supervise(self, run: runner.Run) -> None:
        outcome = await run.wait()
        self.runs.pop((run.order.job_id, run.order.attempt), None)
        self.log.info(
            "run exited", job_id=run.order.job_id, exit_code=outcome.exit_code, signal=outcome.signal
        )
        await self.report_exit(run.order.job_id, run.order.attempt, outcome)

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
        )
        await self._append(body, msg_id=f"exit:{job_id}:{attempt}:{self.node.name}")
        rec = self.records.get(job_id, attempt)
        self.records.put(Record(job_id=job_id, attempt=attempt, pid=rec.pid if rec else 0, exited=True))

    def running_order(self, job_id: int) -> api.LaunchOrder | None:
        """The launch order of the job's run running on this node (its batch node), if any."""
        runs = [run for (job, _), run in self.runs.items() if job == job_id]
        return max(runs, key=lambda run: run.order.attempt).order if runs else None

    def run_dir(self, job_id: int, attempt: int) -> Path:
        """The directory of a run on this node (its script is there)."""
        return self.dir / "jobs" / f"{job_id}.{attempt}"

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
        """Kill the node's runs and stop; they stay unreported, so the next start reports them
        ``killed`` and the scheduler requeues them (nothing is lost, nothing is left running)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for run in list(self.runs.values()):
            run.kill()
        for run in list(self.runs.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(run.proc.wait(), self.config.kill_wait_s + 2)


async def main(ctx: Context) -> None:
    """Register, reconcile, then heartbeat and execute orders until stopped."""
    name = ctx.args.node
    try:
        node = ctx.config.node(name)
    except KeyError:
        raise SystemExit(f"corral-agent: error: node {name!r} is not in {ctx.config.source}") from None
    state_dir = ctx.args.state_dir or ctx.settings.state_dir / "agents" / name
    agent = Agent(ctx.bus, ctx.config, node, Path(state_dir))
    await agent.register()
    await agent.reconcile()
    step_server = Steps(
        ctx.bus.nc,
        name,
        Path(state_dir),
        ctx.config.kill_wait_s,
        agent.running_order,
        agent.run_dir,
        agent._append,
    )
    await step_server.start()
    tasks = [
        asyncio.create_task(agent.heartbeat(ctx.stop)),
        asyncio.create_task(
            ctx.bus.consume(
                subjects.WORK_STREAM,
                f"agent-{name}",
                subjects.work_subject(name),
                agent.handle,
                service=f"agent-{name}",
                batch=16,
                stop=ctx.stop,
            )
        ),
    ]
    await ctx.stop.wait()
    await asyncio.gather(*tasks, return_exceptions=True)
    await step_server.stop()
    await agent.shutdown()
