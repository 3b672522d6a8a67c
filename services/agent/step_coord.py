"""Steps across nodes, on the job's batch node: numbering, layout, starting every node's tasks, watching
until every task exited, and signals to all of them.

1. ``StepLaunch`` (checked by the server): number the step (a counter per run, kept in a file so that ids
   stay unique across agent restarts), lay out the tasks (``steplayout``), subscribe to the step's task
   exits, start this node's tasks and ask each peer node's agent to start theirs (``StepTasks``);
2. in the background: append ``StepStarted``; wait until every task has exited (or the run has ended,
   which kills the step on every node); append ``StepExited`` with the worst task's exit and each task's
   (``task_outcomes``: rank, node, pid, start and end as its supervisor recorded them);
3. ``StepSignal``: signal the step's tasks on every node (SIGKILL = the kill sequence).

Task exits are core NATS messages, which can be lost; the coordinator does not depend on them. It notes its
own node's exits directly, and while exits are missing it polls each peer that owes some (``StepPoll``,
every ``POLL_S``, and at once after a restart): a peer keeps a step's exits for a while after its last task
ended (also across its restarts), and a peer that does not know the step has them counted as killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from pathlib import Path
from typing import Any, Protocol

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from corral.libs.runtime import telemetry
from corral.schemas import events as ev
from corral.schemas.api import ApiError, LaunchOrder
from corral.schemas.steps import (
    StepDone,
    StepLaunch,
    StepLaunched,
    StepPoll,
    StepPolled,
    StepSignal,
    StepTasks,
    TaskExit,
    TaskPlace,
    io_source,
    io_subject,
    step_subject,
)
from corral.services.agent import steplayout
from corral.services.agent.background import Background
from corral.services.agent.step_state import (
    COORD_EXITED,
    COORD_FILE,
    COORD_STARTED,
    STEP_OOM_FILE,
    Appender,
    Coordinated,
    LocalStep,
    RunsView,
    StepError,
    StepTable,
    lost,
    task_outcomes,
)
from corral.services.agent.stepdir import CoordRecord, StepDir

#: Seconds a peer agent may take to start its tasks.
PEER_TIMEOUT = 10.0
#: Seconds between the coordinator's polls of the peers whose task exits it is missing.
POLL_S = 5.0


class LocalTasks(Protocol):
    """What the coordinator needs of this node's own tasks of its steps."""

    async def start(
        self, order: LaunchOrder, step_id: int, user: str, launch: StepLaunch, places: list[TaskPlace]
    ) -> None:
        """Start this node's tasks of a step."""

    def signal(self, job_id: int, attempt: int | None, step_id: int, sig: int, raw: bool = False) -> None:
        """Signal this node's tasks of a step."""


class StepCoord:
    """The steps this (batch) node numbers, starts on every node, and watches."""

    def __init__(
        self,
        nc: Client,
        node: str,
        root: Path,
        counters: Path,
        kill_wait: float,
        runs: RunsView,
        log_appender: Appender,
        table: StepTable,
        local: LocalTasks,
        background: Background,
    ) -> None:
        self.nc = nc
        self.node = node
        self.root = root  # step directories (stepdir.py)
        self.dir = counters  # step counters, a file per run
        self.kill_wait = kill_wait  # seconds a killed step's tasks may take to end
        self.runs = runs  # the node's runs (the run a step belongs to; its directory)
        self.events = log_appender  # StepStarted, StepExited
        self.table = table  # the node's steps
        self.local = local  # this node's own tasks
        self.background = background  # where each step is watched
        self.log = telemetry.logger(node=node)
        self.dir.mkdir(parents=True, exist_ok=True)

    # 1 -------------------------------------------------------------------------------------------
    async def launch(self, order: LaunchOrder, launch: StepLaunch) -> StepLaunched:
        """Number and lay out a step of the order's run, start its tasks on every node, then watch it.

        A launch whose key (srun's random token) this node already coordinates is answered with that step:
        srun asks again when its answer was lost (this agent restarted between starting the step and
        replying, or its answer is slow in coming), and the step must not start twice. A launch still under
        way is answered once it is over, as the first request is."""
        known = self.table.launched(launch.key, order.job_id, order.attempt)
        if known is not None:
            await known.launched.wait()
            if known.failure is not None:
                raise known.failure
            return StepLaunched(step_id=known.step_id, tasks=known.places)
        try:
            places = steplayout.layout(
                list(order.allocations),
                ntasks=launch.ntasks,
                nodes=launch.nodes,
                ntasks_per_node=launch.ntasks_per_node,
                cpus_per_task=launch.cpus_per_task,
                gpus_per_task=launch.gpus_per_task,
            )
        except steplayout.StepLayoutError as exc:
            raise StepError(f"Unable to create step for job {order.job_id}: {exc}") from None
        step_id = self._next_step_id(order.job_id, order.attempt)
        key = (order.job_id, order.attempt, step_id)
        # Peers get the order without the script and the submit-time environment (srun's counts).
        lean = msgspec.structs.replace(
            order, spec=msgspec.structs.replace(order.spec, script="", environment={})
        )
        sdir = StepDir(self.root, key)
        sdir.create()
        # Recorded before anything starts: a restarted agent rebuilds the step from it and keeps watching.
        sdir.write_coord(CoordRecord(order=lean, step_id=step_id, launch=launch, places=places))
        step = Coordinated(order=lean, step_id=step_id, launch=launch, places=places, dir=sdir)
        self.table.coordinated[key] = step
        sub = await self.nc.subscribe(
            io_subject(order.user, launch.key, "exit", "*", "*"), cb=functools.partial(self._on_exit, step)
        )
        peers = [n for n in steplayout.step_nodes(places) if n != self.node]
        request = StepTasks(launch=launch, order=lean, step_id=step_id, user=order.user, tasks=places)
        # This node's supervisor starts while the peers start theirs (each costs an interpreter start).
        results = await asyncio.gather(
            self.local.start(lean, step_id, order.user, launch, places),
            *(self._ask_peer(peer, request) for peer in peers),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.signal_everywhere(step, signal.SIGKILL)
            await sub.unsubscribe()
            self.table.coordinated.pop(key, None)
            sdir.file(COORD_FILE).unlink(missing_ok=True)  # nothing to watch after a restart
            step.failure = errors[0]
            step.launched.set()
            raise errors[0]
        step.launched.set()
        self.background.spawn(self._watch(step, sub))
        return StepLaunched(step_id=step_id, tasks=places)

    async def _ask_peer(self, peer: str, request: StepTasks | StepSignal) -> None:
        data = msgspec.json.encode(request)
        try:
            msg = await self.nc.request(step_subject(peer, f"agent-{self.node}"), data, timeout=PEER_TIMEOUT)
        except Exception as exc:
            raise StepError(f"node {peer} did not start its tasks: {exc!r}", "unavailable") from None
        reply = msgspec.json.decode(msg.data, type=StepDone | ApiError)
        if isinstance(reply, ApiError):
            raise StepError(f"node {peer}: {reply.error}", reply.code)

    def _next_step_id(self, job_id: int, attempt: int) -> int:
        """The run's next step number, recorded (fsync) before it is used."""
        path = self.dir / f"{job_id}.{attempt}"
        try:
            step_id = int(path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            step_id = 0
        tmp = path.with_name(path.name + ".tmp")  # not with_suffix: <job>.<attempt> has a dot already
        with open(tmp, "w") as fh:
            fh.write(str(step_id + 1))
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
        return step_id

    async def resume(self, sdir: StepDir, coord: CoordRecord, local: LocalStep | None) -> None:
        """Watch again a step a previous agent process coordinated and whose end it did not record."""
        step = Coordinated.resumed_from(sdir, coord)
        for exit in local.exits.values() if local is not None else ():
            step.note_exit(exit)
        self.table.coordinated[sdir.key] = step
        sub = await self.nc.subscribe(
            io_subject(coord.order.user, coord.launch.key, "exit", "*", "*"),
            cb=functools.partial(self._on_exit, step),
        )
        self.background.spawn(self._watch(step, sub))

    # 2 -------------------------------------------------------------------------------------------
    async def _on_exit(self, step: Coordinated, msg: Msg) -> None:
        # Only the agent of the task's node speaks for it, and only about that task.
        source = io_source(msg.subject, {p.task: p.node for p in step.places})
        try:
            exit = msgspec.json.decode(msg.data, type=TaskExit)
        except msgspec.DecodeError:
            return
        if source is not None and exit.task == source[1]:
            step.note_exit(exit)

    async def _poll_peers(self, step: Coordinated) -> None:
        """Ask each peer that owes task exits for them; a peer that no longer knows the step lost its
        tasks (an agent restart kills them): they count as killed."""
        order = step.order
        owed = sorted({p.node for p in step.places if p.task not in step.exits and p.node != self.node})
        request = StepPoll(job_id=order.job_id, attempt=order.attempt, step_id=step.step_id)
        for peer in owed:
            try:
                subject = step_subject(peer, f"agent-{self.node}")
                msg = await self.nc.request(subject, msgspec.json.encode(request), timeout=PEER_TIMEOUT)
                reply = msgspec.json.decode(msg.data, type=StepPolled | ApiError)
            except Exception as exc:
                self.log.warning("step poll failed", peer=peer, error=repr(exc))
                continue
            if isinstance(reply, ApiError):
                self.log.warning("step poll refused", peer=peer, error=reply.error)
                continue
            for exit in reply.exits:
                step.note_exit(exit)
            if not reply.known:
                for place in step.places:
                    if place.node == peer and place.task not in step.exits:
                        step.note_exit(lost(place))

    async def _watch(self, step: Coordinated, sub: Any) -> None:
        order = step.order
        nodes = steplayout.step_nodes(step.places)
        ids = f"{order.job_id}:{order.attempt}:{step.step_id}:{self.node}"
        if not step.dir.marked(COORD_STARTED):
            await self._append_step_started(step, nodes, ids)
        await self._watch_until_done(step)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if not step.killed and self.runs.running_order(order.job_id) is None:
            # Its tasks ended as their run was being killed (srun passes the run's SIGTERM on to them).
            step.killed = True
        exits = list(step.exits.values())
        outcomes, omitted = task_outcomes(exits, len(step.places))
        if any(e.oom for e in exits):
            # Recorded in the run's directory, so the run's exit says so even after an agent restart.
            with contextlib.suppress(OSError):
                (self.runs.run_dir(order.job_id, order.attempt) / STEP_OOM_FILE).touch()
        await self.events.append(
            ev.StepExited(
                **_step_ids(step, self.node),
                exit_code=max((e.exit_code for e in exits), default=0),
                signal=max((e.signal for e in exits), default=signal.SIGKILL if step.killed else 0),
                killed=step.killed,
                oom=any(e.oom for e in exits),
                tasks=outcomes,
                tasks_omitted=omitted,
            ),
            msg_id=f"step-exited:{ids}",  # once, also when a restarted agent appends it again
            traceparent=order.traceparent,
            cause=order.cause_id,  # the run's allocation
        )
        step.dir.mark(COORD_EXITED)
        key = (order.job_id, order.attempt, step.step_id)
        self.table.coordinated.pop(key, None)
        self.table.remember_ended(step)
        local = self.table.local.get(key)
        if local is None:
            step.dir.remove()
        elif local.finished.is_set():
            self.table.forget(local)

    async def _append_step_started(self, step: Coordinated, nodes: list[str], ids: str) -> None:
        await self.events.append(
            ev.StepStarted(
                **_step_ids(step, self.node),
                name=step.launch.name or os.path.basename(step.launch.argv[0]),
                nodes=nodes,
                ntasks=len(step.places),
                cpus=len(step.places) * step.launch.cpus_per_task,
                gpus=sum(len(p.gpus) for p in step.places) if step.launch.gpus_per_task else 0,
            ),
            msg_id=f"step-started:{ids}",
            traceparent=step.order.traceparent,
            cause=step.order.cause_id,  # the run's allocation
        )
        step.dir.mark(COORD_STARTED)

    async def _watch_until_done(self, step: Coordinated) -> None:
        """Until every task exited: poll the peers that owe exits, kill the step if its run ended."""
        order = step.order
        loop = asyncio.get_running_loop()
        # Resumed after a restart: the peers' exits published meanwhile were lost, ask at once.
        next_poll = loop.time() + (0.0 if step.resumed else POLL_S)
        while not step.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(step.done.wait(), 0.5)
            if not step.done.is_set() and loop.time() >= next_poll:
                await self._poll_peers(step)
                next_poll = loop.time() + POLL_S
            current = (
                None if step.done.is_set() else self.runs.running_order(order.job_id)
            )  # decoded afresh: compare runs
            if not step.done.is_set() and (current is None or current.attempt != order.attempt):
                # The run ended (or was replaced): its steps end with it, on every node.
                step.killed = True
                self.signal_everywhere(step, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(step.done.wait(), self.kill_wait + 5)
                break

    # 3 -------------------------------------------------------------------------------------------
    async def signal_step(self, caller: str, request: StepSignal) -> None:
        """srun's signal to its step: to the step's tasks on every node (signal 0: is it still running?)."""
        # srun names no attempt: its step belongs to the job's run live on this (batch) node.
        order = self.runs.running_order(request.job_id)
        attempt = order.attempt if request.attempt is None and order is not None else request.attempt
        step = (
            None
            if attempt is None
            else self.table.coordinated.get((request.job_id, attempt, request.step_id))
        )
        if step is None:
            raise StepError(f"Step {request.job_id}.{request.step_id} is not running", "not_found")
        if step.order.user != caller:
            raise StepError("Access/permission denied", "forbidden")
        if request.signal == 0:
            return  # srun's liveness check: the step still runs
        if request.signal == signal.SIGKILL:
            step.killed = True
        self.signal_everywhere(step, request.signal)

    def signal_run(self, job_id: int, attempt: int, sig: int) -> None:
        """Signal the tasks of every step of a run this node coordinates, on every node, as it is."""
        for (job, run, _), step in list(self.table.coordinated.items()):
            if (job, run) == (job_id, attempt):
                self.signal_everywhere(step, sig, raw=True)

    def signal_everywhere(self, step: Coordinated, sig: int, raw: bool = False) -> None:
        """Signal the step's tasks here and on each peer (not waiting for the peers)."""
        order = step.order
        self.local.signal(order.job_id, order.attempt, step.step_id, sig, raw)
        request = StepSignal(
            job_id=order.job_id, step_id=step.step_id, signal=sig, attempt=order.attempt, raw=raw
        )
        for peer in steplayout.step_nodes(step.places):
            if peer != self.node:
                self.background.spawn(self._ask_peer_quietly(peer, request))

    async def _ask_peer_quietly(self, peer: str, request: StepSignal) -> None:
        try:
            await self._ask_peer(peer, request)
        except StepError as exc:
            self.log.warning("signal to a peer failed", peer=peer, error=str(exc))

    def had_oom(self, job_id: int, attempt: int) -> bool:
        """Whether a step of the run this node coordinates had a task OOM-killed (the job ends OOM)."""
        return (self.runs.run_dir(job_id, attempt) / STEP_OOM_FILE).exists()


def _step_ids(step: Coordinated, node: str) -> dict[str, Any]:
    """The fields that name a step in its facts (StepStarted, StepExited)."""
    order = step.order
    return {"job_id": order.job_id, "attempt": order.attempt, "step_id": step.step_id, "node": node}
