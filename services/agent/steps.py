"""Job steps on a node (slurmstepd's part): the agent side of ``srun``.

The agent answers ``corral.step.<node>.<caller>`` (``corral.schemas.steps``). The job's *batch node*
coordinates each step of its runs:

1. ``StepLaunch`` from the job's owner: check the caller against the run's launch order, number the step
   (a counter per run, kept in a file so that ids stay unique across agent restarts), lay out the tasks
   (``steplayout``), subscribe to the step's task exits, start this node's tasks and ask each peer node's
   agent to start theirs (``StepTasks``), then reply with the layout;
2. in the background: append ``StepStarted``; wait until every task has exited (or the run has ended,
   which kills the step on every node); append ``StepExited`` with the worst task's exit;
3. ``StepSignal`` from the owner: signal the step's tasks on every node (SIGKILL = the kill sequence);
   ``StepPoll`` from the coordinator: the exits of this node's tasks of a step (see below);
4. ``AllocationRelease`` from the owner: end an interactive allocation (``ALLOCATION_SCRIPT``) with an
   exit code.

Every node runs its tasks as real processes, each in its own session, in the step's directory, with the
job's environment plus the task's (``steplayout.task_environment``); stdout/stderr go to srun on
``corral.io.<user>.<key>.{out,err}.<task>`` (or to ``-o/-e`` files), then the task's exit on ``.exit.<task>``;
srun's stdin arrives for task 0 on ``corral.io.<user>.<key>.in`` (an empty message is end of file).

Task exits are core NATS messages, which can be lost; the coordinator does not depend on them. It notes its
own node's exits directly, and while exits are missing it polls each peer that owes some (``StepPoll``,
every ``POLL_S``): a peer keeps a step's exits for ``KEEP_S`` after its last task ended, and a peer that no
longer knows the step (its agent restarted, which killed its tasks) has them counted as killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from corral.libs import memcg, telemetry
from corral.schemas import events as ev
from corral.schemas.api import ApiError, LaunchOrder
from corral.schemas.steps import (
    ALLOCATION_SCRIPT,
    AllocationRelease,
    StepDone,
    StepLaunch,
    StepLaunched,
    StepPoll,
    StepPolled,
    StepRequest,
    StepSignal,
    StepTasks,
    TaskExit,
    TaskPlace,
    io_subject,
    step_subject,
)
from corral.services.agent import steplayout
from corral.services.agent.jobenv import job_environment

#: Seconds a peer agent may take to start its tasks.
PEER_TIMEOUT = 10.0
#: Seconds the agent tries to hand an interactive allocation its exit code.
RELEASE_TIMEOUT = 10.0
#: Seconds between the coordinator's polls of the peers whose task exits it is missing.
POLL_S = 5.0
#: Seconds a peer keeps the exits of a step whose tasks have all ended (for the coordinator's poll).
KEEP_S = 60.0
_CHUNK = 1 << 16


class StepError(Exception):
    """A step request refused; the message is for srun's user."""

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code  # ApiError code


@dataclass
class LocalStep:
    """This node's tasks of one step."""

    user: str  # the job's owner (I/O subjects)
    key: str  # the step's I/O token
    step: tuple[int, int, int]  # (job, attempt, step id)
    ntasks: int  # how many of the step's tasks run on this node
    procs: dict[int, asyncio.subprocess.Process] = field(default_factory=dict)  # task id -> process
    exits: dict[int, TaskExit] = field(default_factory=dict)  # task id -> exit, of this node's tasks
    killing: bool = False  # the kill sequence started


@dataclass
class Coordinated:
    """A step this (batch) node numbered and watches."""

    order: LaunchOrder  # the run's launch order
    step_id: int  # its number
    launch: StepLaunch  # what srun asked for
    places: list[TaskPlace]  # its tasks
    exits: dict[int, TaskExit] = field(default_factory=dict)  # task id -> exit, as they arrive
    done: asyncio.Event = field(default_factory=asyncio.Event)  # every task exited
    killed: bool = False  # killed by srun (SIGKILL) or because the run ended


class Steps:
    """The step server of one node's agent."""

    def __init__(
        self,
        nc: Client,
        node: str,
        state_dir: Path,
        kill_wait: float,
        orders: Callable[[int], LaunchOrder | None],
        run_dir: Callable[[int, int], Path],
        append: Callable[[ev.Event], Any],
        cgroup_of: Callable[[int, int], str | None] = lambda job_id, attempt: None,
    ) -> None:
        self.nc = nc
        self.node = node
        self.dir = state_dir / "steps"
        self.kill_wait = kill_wait
        self.orders = orders  # job id -> launch order of its run running on this node, if any
        self.run_dir = run_dir  # (job, attempt) -> the run's directory (where its script is)
        self.append = append  # append an event to the log (retrying)
        self.cgroup_of = cgroup_of  # (job, attempt) -> the memory cgroup of its run on this node, if any
        # Steps by (job, attempt, step): a requeued job's new run numbers its steps from 0 again, and the
        # old run's steps must not be confused with them (an old step's kill must not reach a new one).
        self.local: dict[tuple[int, int, int], LocalStep] = {}
        self.coordinated: dict[tuple[int, int, int], Coordinated] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.log = telemetry.logger(node=node)
        self.dir.mkdir(parents=True, exist_ok=True)

    async def start(self) -> None:
        """Answer step requests for this node."""
        await self.nc.subscribe(step_subject(self.node, "*"), cb=self._on_request)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _on_request(self, msg: Msg) -> None:
        # Each request in its own task: a launch waits for peers, which may be waiting for us.
        self._spawn(self._answer(msg))

    async def _answer(self, msg: Msg) -> None:
        caller = msg.subject.rsplit(".", 1)[-1]
        reply: msgspec.Struct
        try:
            request = msgspec.json.decode(msg.data, type=StepRequest)
            reply = await self._dispatch(caller, request)
        except msgspec.DecodeError as exc:
            reply = ApiError(error=f"malformed step request: {exc}")
        except StepError as exc:
            reply = ApiError(error=str(exc), code=exc.code)
        except Exception as exc:
            self.log.exception("step request failed")
            reply = ApiError(
                error=f"node {self.node}: internal error ({type(exc).__name__})", code="internal"
            )
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(msgspec.json.encode(reply))

    async def _dispatch(self, caller: str, request: StepRequest) -> msgspec.Struct:
        peer = caller.startswith("agent-")
        if isinstance(request, StepTasks):
            if not peer:
                raise StepError("Access/permission denied", "forbidden")
            await self._start_local(
                request.order, request.step_id, request.user, request.launch, request.tasks
            )
            return StepDone()
        if isinstance(request, StepPoll):
            if not peer:
                raise StepError("Access/permission denied", "forbidden")
            local = self.local.get((request.job_id, request.attempt, request.step_id))
            return StepPolled(known=local is not None, exits=list(local.exits.values()) if local else [])
        if isinstance(request, StepSignal):
            if peer:
                self._signal_local(
                    request.job_id, request.attempt, request.step_id, request.signal, request.raw
                )
            else:
                await self._signal_step(caller, request)
            return StepDone()
        order = self._owned_order(caller, request.job_id)
        if isinstance(request, StepLaunch):
            return await self._launch(order, request)
        await self._release(order, request)
        return StepDone()

    def _owned_order(self, caller: str, job_id: int) -> LaunchOrder:
        order = self.orders(job_id)
        if order is None:
            raise StepError(f"Job {job_id} is not running on {self.node}, its batch node", "not_found")
        if order.user != caller:
            raise StepError("Access/permission denied", "forbidden")
        return order

    # 1 -------------------------------------------------------------------------------------------
    async def _launch(self, order: LaunchOrder, launch: StepLaunch) -> StepLaunched:
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
        step = Coordinated(order=order, step_id=step_id, launch=launch, places=places)
        self.coordinated[(order.job_id, order.attempt, step_id)] = step
        sub = await self.nc.subscribe(
            io_subject(order.user, launch.key, "exit", None) + ".*", cb=functools.partial(self._on_exit, step)
        )
        # Peers get the order without the script and the submit-time environment (srun's counts).
        lean = msgspec.structs.replace(
            order, spec=msgspec.structs.replace(order.spec, script="", environment={})
        )
        peers = [n for n in steplayout.step_nodes(places) if n != self.node]
        request = StepTasks(launch=launch, order=lean, step_id=step_id, user=order.user, tasks=places)
        try:
            await asyncio.gather(*(self._ask_peer(peer, request) for peer in peers))
        except StepError:
            self._signal_everywhere(step, signal.SIGKILL)
            await sub.unsubscribe()
            self.coordinated.pop((order.job_id, order.attempt, step_id), None)
            raise
        await self._start_local(lean, step_id, order.user, launch, places)
        self._spawn(self._watch(step, sub))
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
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(str(step_id + 1))
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
        return step_id

    async def _start_local(
        self, order: LaunchOrder, step_id: int, user: str, launch: StepLaunch, places: list[TaskPlace]
    ) -> None:
        mine = [p for p in places if p.node == self.node]
        if not mine:
            return
        local = LocalStep(
            user=user, key=launch.key, step=(order.job_id, order.attempt, step_id), ntasks=len(mine)
        )
        self.local[local.step] = local
        node_order = msgspec.structs.replace(order, node=self.node)
        alloc = next(a for a in order.allocations if a.node == self.node)
        job_env = job_environment(node_order, launch.environment, os.getuid())
        # The job's variables of this node (job_environment describes the batch node).
        gpus = ",".join(str(g) for g in alloc.gpus)
        job_env.update({"SLURM_CPUS_ON_NODE": str(alloc.cpus), "SLURM_GPUS_ON_NODE": str(len(alloc.gpus))})
        if gpus:
            job_env.update({"SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus})
        for place in mine:
            env = steplayout.task_environment(job_env, place, places, step_id, launch)
            # Started (and task 0's stdin subscribed) before the reply, so no stdin is lost.
            started = await self._start_task(local, order, step_id, launch, place, env)
            if started is not None:
                self._spawn(self._supervise_task(local, place, *started))

    async def _start_task(
        self,
        local: LocalStep,
        order: LaunchOrder,
        step_id: int,
        launch: StepLaunch,
        place: TaskPlace,
        env: dict[str, str],
    ) -> tuple[asyncio.subprocess.Process, Any] | None:
        """Start one task; None if it could not be (its exit is reported at once)."""
        fds: list[int] = []
        try:
            # The task joins its run's memory cgroup before exec (confine.py), so its OOM is the run's.
            procs_fd = _procs_fd(self.cgroup_of(order.job_id, order.attempt))
            if procs_fd is not None:
                fds.append(procs_fd)
            stdout: int = asyncio.subprocess.PIPE
            stderr: int = asyncio.subprocess.PIPE
            append = launch.open_mode == "append"
            if launch.stdout:
                stdout = _open(
                    steplayout.expand_step_pattern(launch.stdout, order, step_id, place, launch.cwd), append
                )
                fds.append(stdout)
                stderr = stdout
            if launch.stderr:
                stderr = _open(
                    steplayout.expand_step_pattern(launch.stderr, order, step_id, place, launch.cwd), append
                )
                fds.append(stderr)
            stdin = (
                asyncio.subprocess.PIPE if launch.stdin and place.task == 0 else asyncio.subprocess.DEVNULL
            )
            proc = await asyncio.create_subprocess_exec(
                *launch.argv,
                cwd=launch.cwd,
                env=env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=None if procs_fd is None else functools.partial(memcg.join_self_quietly, procs_fd),
            )
        except OSError as exc:
            error = f"execve(): {launch.argv[0]}: {exc.strerror}"
            if exc.filename == launch.cwd:
                error = f"chdir({launch.cwd}): {exc.strerror}"
            await self._publish_exit(
                local, TaskExit(task=place.task, node=self.node, exit_code=2, error=error)
            )
            return None
        finally:
            for fd in fds:
                os.close(fd)
        local.procs[place.task] = proc
        stdin_sub = None
        if proc.stdin is not None:
            stdin_sub = await self.nc.subscribe(
                io_subject(local.user, local.key, "in"), cb=functools.partial(_feed, proc)
            )
        return proc, stdin_sub

    async def _supervise_task(
        self, local: LocalStep, place: TaskPlace, proc: asyncio.subprocess.Process, stdin_sub: Any
    ) -> None:
        """Stream a task's output to srun until it exits, then report its exit."""
        out_subject = io_subject(local.user, local.key, "out", place.task)
        err_subject = io_subject(local.user, local.key, "err", place.task)
        pumps = [
            _pump(self.nc, stream, subject)
            for stream, subject in ((proc.stdout, out_subject), (proc.stderr, err_subject))
            if stream is not None
        ]
        pumping = asyncio.gather(*pumps)
        code = await proc.wait()
        # Whatever the task left in its session goes with it (it would hold the output pipes open).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await pumping
        if stdin_sub is not None:
            with contextlib.suppress(Exception):
                await stdin_sub.unsubscribe()
        exit_code, sig = (code, 0) if code >= 0 else (0, -code)
        await self._publish_exit(
            local, TaskExit(task=place.task, node=self.node, exit_code=exit_code, signal=sig)
        )

    async def _publish_exit(self, local: LocalStep, exit: TaskExit) -> None:
        local.exits[exit.task] = exit
        coordinated = self.coordinated.get(local.step)
        if coordinated is not None:
            self._note_exit(coordinated, exit)  # this node coordinates the step: no round trip
        elif len(local.exits) >= local.ntasks:
            # A peer's part is over: keep the exits a while for the coordinator's poll, then forget it.
            asyncio.get_running_loop().call_later(KEEP_S, self._forget, local)
        with contextlib.suppress(Exception):
            await self.nc.publish(
                io_subject(local.user, local.key, "exit", exit.task), msgspec.json.encode(exit)
            )
            await self.nc.flush()

    def _forget(self, local: LocalStep) -> None:
        if self.local.get(local.step) is local:
            del self.local[local.step]

    # 2 -------------------------------------------------------------------------------------------
    async def _on_exit(self, step: Coordinated, msg: Msg) -> None:
        try:
            exit = msgspec.json.decode(msg.data, type=TaskExit)
        except msgspec.DecodeError:
            return
        self._note_exit(step, exit)

    def _note_exit(self, step: Coordinated, exit: TaskExit) -> None:
        if any(p.task == exit.task for p in step.places):
            step.exits[exit.task] = exit
        if len(step.exits) >= len(step.places):
            step.done.set()

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
                self._note_exit(step, exit)
            if not reply.known:
                for place in step.places:
                    if place.node == peer and place.task not in step.exits:
                        self._note_exit(step, _lost(place))

    async def _watch(self, step: Coordinated, sub: Any) -> None:
        order = step.order
        nodes = steplayout.step_nodes(step.places)
        await self.append(
            ev.StepStarted(
                job_id=order.job_id,
                attempt=order.attempt,
                step_id=step.step_id,
                node=self.node,
                name=step.launch.name or os.path.basename(step.launch.argv[0]),
                nodes=nodes,
                ntasks=len(step.places),
                cpus=len(step.places) * step.launch.cpus_per_task,
                gpus=sum(len(p.gpus) for p in step.places) if step.launch.gpus_per_task else 0,
            )
        )
        loop = asyncio.get_running_loop()
        next_poll = loop.time() + POLL_S
        while not step.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(step.done.wait(), 0.5)
            if not step.done.is_set() and loop.time() >= next_poll:
                await self._poll_peers(step)
                next_poll = loop.time() + POLL_S
            current = (
                None if step.done.is_set() else self.orders(order.job_id)
            )  # decoded afresh: compare runs
            if not step.done.is_set() and (current is None or current.attempt != order.attempt):
                # The run ended (or was replaced): its steps end with it, on every node.
                step.killed = True
                self._signal_everywhere(step, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(step.done.wait(), self.kill_wait + 5)
                break
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if not step.killed and self.orders(order.job_id) is None:
            # Its tasks ended as their run was being killed (srun passes the run's SIGTERM on to them).
            step.killed = True
        exits = list(step.exits.values())
        await self.append(
            ev.StepExited(
                job_id=order.job_id,
                attempt=order.attempt,
                step_id=step.step_id,
                node=self.node,
                exit_code=max((e.exit_code for e in exits), default=0),
                signal=max((e.signal for e in exits), default=signal.SIGKILL if step.killed else 0),
                killed=step.killed,
            )
        )
        self.coordinated.pop((order.job_id, order.attempt, step.step_id), None)
        self.local.pop((order.job_id, order.attempt, step.step_id), None)

    # 3 -------------------------------------------------------------------------------------------
    async def _signal_step(self, caller: str, request: StepSignal) -> None:
        # srun names no attempt: its step belongs to the job's run live on this (batch) node.
        order = self.orders(request.job_id)
        attempt = order.attempt if request.attempt is None and order is not None else request.attempt
        step = None if attempt is None else self.coordinated.get((request.job_id, attempt, request.step_id))
        if step is None:
            raise StepError(f"Step {request.job_id}.{request.step_id} is not running", "not_found")
        if step.order.user != caller:
            raise StepError("Access/permission denied", "forbidden")
        if request.signal == 0:
            return  # srun's liveness check: the step still runs
        if request.signal == signal.SIGKILL:
            step.killed = True
        self._signal_everywhere(step, request.signal)

    def signal_run(self, job_id: int, attempt: int, sig: int, *, everywhere: bool) -> None:
        """Signal the tasks of every step of a run (``scancel -s``, ``--signal``): this node's tasks, or with
        ``everywhere`` (the batch node, which coordinates the run's steps) the tasks on every node. The
        signal is delivered as it is: a SIGKILL here is ``scancel -f -s KILL``, not srun's kill sequence."""
        if everywhere:
            for (job, run, _), step in list(self.coordinated.items()):
                if (job, run) == (job_id, attempt):
                    self._signal_everywhere(step, sig, raw=True)
            return
        for (job, run, step_id), _ in list(self.local.items()):
            if (job, run) == (job_id, attempt):
                self._signal_local(job_id, attempt, step_id, sig, raw=True)

    def _signal_everywhere(self, step: Coordinated, sig: int, raw: bool = False) -> None:
        order = step.order
        self._signal_local(order.job_id, order.attempt, step.step_id, sig, raw)
        request = StepSignal(
            job_id=order.job_id, step_id=step.step_id, signal=sig, attempt=order.attempt, raw=raw
        )
        for peer in steplayout.step_nodes(step.places):
            if peer != self.node:
                self._spawn(self._ask_peer_quietly(peer, request))

    async def _ask_peer_quietly(self, peer: str, request: StepSignal) -> None:
        try:
            await self._ask_peer(peer, request)
        except StepError as exc:
            self.log.warning("signal to a peer failed", peer=peer, error=str(exc))

    def _signal_local(
        self, job_id: int, attempt: int | None, step_id: int, sig: int, raw: bool = False
    ) -> None:
        """Signal this node's tasks of a step of that run (of any run for ``attempt`` None: an old agent)."""
        for (job, run, step), local in list(self.local.items()):
            if (job, step) == (job_id, step_id) and attempt in (None, run):
                self._signal_tasks(local, sig, raw)

    def _signal_tasks(self, local: LocalStep, sig: int, raw: bool = False) -> None:
        """Signal a step's tasks here; srun's SIGKILL (not ``raw``) is the kill sequence."""
        if sig == signal.SIGKILL and not raw:
            if not local.killing:
                local.killing = True
                self._spawn(self._kill_sequence(local))
            return
        for proc in local.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)

    async def _kill_sequence(self, local: LocalStep) -> None:
        procs = list(local.procs.values())
        for proc in procs:
            for sig in (signal.SIGCONT, signal.SIGTERM):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), self.kill_wait)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    # 4 -------------------------------------------------------------------------------------------
    async def _release(self, order: LaunchOrder, request: AllocationRelease) -> None:
        if order.spec.script != ALLOCATION_SCRIPT:
            raise StepError(f"Job {order.job_id} is not an interactive allocation (srun/salloc)")
        fifo = self.run_dir(order.job_id, order.attempt) / "release"
        code = f"{min(max(request.exit_code, 0), 255)}\n".encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RELEASE_TIMEOUT
        while True:
            with contextlib.suppress(FileExistsError):
                os.mkfifo(fifo)
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                # ENXIO: the script is not reading yet.
                if exc.errno != errno.ENXIO or loop.time() > deadline:
                    raise StepError(
                        f"cannot release job {order.job_id}: {exc.strerror}", "unavailable"
                    ) from None
                await asyncio.sleep(0.05)
                continue
            try:
                os.write(fd, code)
            finally:
                os.close(fd)
            return

    async def stop(self) -> None:
        """Kill every task of this node's steps (the agent is stopping)."""
        for local in list(self.local.values()):
            for proc in local.procs.values():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _lost(place: TaskPlace) -> TaskExit:
    """The exit of a task whose node forgot the step: killed with its agent."""
    return TaskExit(
        task=place.task,
        node=place.node,
        exit_code=0,
        signal=signal.SIGKILL,
        error=f"node {place.node}: the task was lost (its agent restarted)",
    )


def _procs_fd(cgroup: str | None) -> int | None:
    """A descriptor to join ``cgroup`` with; None without one (the task runs unconfined)."""
    if cgroup is None:
        return None
    try:
        return memcg.open_procs(cgroup)
    except OSError:
        return None


def _open(path: str, append: bool) -> int:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC), 0o644)


async def _pump(nc: Client, stream: asyncio.StreamReader, subject: str) -> None:
    """Forward a task's output to srun, chunk by chunk, as it comes."""
    while chunk := await stream.read(_CHUNK):
        with contextlib.suppress(Exception):
            await nc.publish(subject, chunk)


async def _feed(proc: asyncio.subprocess.Process, msg: Msg) -> None:
    """Write srun's stdin to task 0 (an empty message closes it)."""
    stdin = proc.stdin
    if stdin is None or stdin.is_closing():
        return
    try:
        if msg.data:
            stdin.write(msg.data)
            await stdin.drain()
        else:
            stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass
