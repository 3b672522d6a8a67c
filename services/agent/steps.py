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

Every node runs its tasks of a step under a detached supervisor of their own (``stepd.py``, one per step and
node, Slurm's slurmstepd), so they outlive the agent. The agent writes the step's directory
(``stepdir.py``: the tasks' argv, cwd, environment - the job's plus the task's,
``steplayout.task_environment`` - and output files), starts the supervisor, which starts each task in its
own session and records pids and exits there. The agent follows the step through those files: it tails
the spool files (stdout/stderr when there are no ``-o/-e`` files) to srun on
``corral.io.<user>.<key>.{out,err}.<task>``, then publishes each exit on ``.exit.<task>``; srun's stdin
arrives for task 0 on ``corral.io.<user>.<key>.in`` (an empty message is end of file) and goes down a pipe
this agent process holds (after an agent restart task 0 sees end of file). A restarted agent re-adopts every
step directory (``start``): it tails on from its saved offsets, reports the exits not yet reported, and the
batch node rebuilds the steps it coordinates and keeps watching them. Signals reach tasks by the process
groups recorded on disk, checked against their start ticks.

Task exits are core NATS messages, which can be lost; the coordinator does not depend on them. It notes its
own node's exits directly, and while exits are missing it polls each peer that owes some (``StepPoll``,
every ``POLL_S``, and at once after a restart): a peer keeps a step's exits for ``KEEP_S`` after its last
task ended (also across its restarts), and a peer that does not know the step has them counted as killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from corral.libs.runtime import telemetry
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
from corral.services.agent import holes, killseq, memcg, stepd, stepdir, steplayout
from corral.services.agent.jobenv import job_environment
from corral.services.agent.step_cgroups import StepCgroup, StepCgroups
from corral.services.agent.stepdir import (
    CoordRecord,
    OutputTarget,
    StepDir,
    StepPids,
    StepSpec,
    TailState,
    TaskSpec,
)

#: Seconds a peer agent may take to start its tasks.
PEER_TIMEOUT = 10.0
#: Seconds the agent tries to hand an interactive allocation its exit code.
RELEASE_TIMEOUT = 10.0
#: The run directory's marker: a step of the run had a task OOM-killed (the run's exit reports ``oom``).
STEP_OOM_FILE = "step_oom"
#: Published spool bytes of a file whose disk space is freed at once (see ``_reclaim``).
RECLAIM_BYTES = 1 << 20
#: Seconds between the coordinator's polls of the peers whose task exits it is missing.
POLL_S = 5.0
#: Seconds a peer keeps the exits of a step whose tasks have all ended (for the coordinator's poll).
KEEP_S = 60.0
#: Seconds between looks at a step's spool and exit files (output latency; exits also wake it at once).
TAIL_S = 0.02
#: Seconds between saves of how far the output was published, while it flows.
SAVE_S = 0.25
#: Seconds a step's supervisor may take to start the tasks and answer.
HANDSHAKE_S = 30.0
#: Files of a step directory (stepdir.py) the coordinator's side uses.
COORD_FILE = "coord.json"
COORD_STARTED = "coord.started"
COORD_EXITED = "coord.exited"
_CHUNK = 1 << 16


class StepError(Exception):
    """A step request refused; the message is for srun's user."""

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code  # ApiError code


@dataclass
class LocalStep:
    """This node's tasks of one step: run by their supervisor (stepd.py), followed through its directory."""

    user: str  # the job's owner (I/O subjects)
    key: str  # the step's I/O token
    step: tuple[int, int, int]  # (job, attempt, step id)
    tasks: list[int]  # this node's task ids
    dir: StepDir  # where its supervisor and the agent keep what outlives the agent
    pids: StepPids | None = None  # the supervisor's and the tasks' pids, once known
    exits: dict[int, TaskExit] = field(default_factory=dict)  # task id -> exit, published
    offsets: dict[str, int] = field(default_factory=dict)  # spool file -> bytes published
    punched: dict[str, int] = field(default_factory=dict)  # spool file -> bytes whose disk space was freed
    spooled: set[str] | None = None  # the spool files its tasks write (not -o/-e files); None: unknown
    proc: subprocess.Popen[bytes] | None = None  # the supervisor, when this agent process started it
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the supervisor said a task ended
    stdin_fd: int | None = None  # write end of task 0's stdin (srun's), held by this agent process
    stdin_sub: Any = None  # the subscription feeding it
    killing: bool = False  # the kill sequence started
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # every exit published
    cgroup: StepCgroup = field(default_factory=lambda: StepCgroup(None, False))  # the memory cgroup joined

    @property
    def ntasks(self) -> int:
        """How many of the step's tasks run on this node."""
        return len(self.tasks)


@dataclass
class Coordinated:
    """A step this (batch) node numbered and watches."""

    order: LaunchOrder  # the run's launch order (without script and submit environment)
    step_id: int  # its number
    launch: StepLaunch  # what srun asked for
    places: list[TaskPlace]  # its tasks
    dir: StepDir  # its directory (coordination record and markers)
    resumed: bool = False  # rebuilt from its directory by a restarted agent
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
        append: Callable[..., Any],  # (event, msg_id=...)
        cgroups: StepCgroups | None = None,
        latest_attempt: Callable[[int], int] = lambda job_id: -1,
        reached: Callable[[str], None] = lambda point: None,
    ) -> None:
        self.nc = nc
        self.node = node
        self.dir = state_dir / "steps"  # step counters
        self.root = state_dir / "stepd"  # step directories (stepdir.py)
        self.kill_wait = kill_wait
        self.orders = orders  # job id -> launch order of its run running on this node, if any
        self.run_dir = run_dir  # (job, attempt) -> the run's directory (where its script is)
        self.append = append  # append an event to the log (retrying)
        self.latest_attempt = latest_attempt  # job -> the newest attempt this node has seen (-1: none)
        self.reached = reached  # a crash point of a step's launch (failure tests: crashpoints.py)
        # The memory cgroups tasks join (none: unconfined).
        self.cgroups = cgroups or StepCgroups(lambda j, a: None, lambda order: None, lambda j, a: None)
        # Steps by (job, attempt, step): a requeued job's new run numbers its steps from 0 again, and the
        # old run's steps must not be confused with them (an old step's kill must not reach a new one).
        self.local: dict[tuple[int, int, int], LocalStep] = {}
        self.coordinated: dict[tuple[int, int, int], Coordinated] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.ready = asyncio.Event()  # the step directories a previous agent left are adopted
        self.log = telemetry.logger(node=node)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    async def start(self) -> None:
        """Re-adopt the steps a previous agent process left, then answer step requests for this node."""
        for sdir in StepDir.all(self.root):
            await self._adopt(sdir)
        # A step of an attempt older than one this node has seen since is stale: its tasks end now (a kill
        # order for it is on its way too; this does not wait for it).
        for key in [k for k in self.local if k[1] < self.latest_attempt(k[0])]:
            self.log.info("ending a stale attempt's step", step=key)
            self.kill_step_here(key)
        self.ready.set()
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
        self.coordinated[key] = step
        sub = await self.nc.subscribe(
            io_subject(order.user, launch.key, "exit", None) + ".*", cb=functools.partial(self._on_exit, step)
        )
        peers = [n for n in steplayout.step_nodes(places) if n != self.node]
        request = StepTasks(launch=launch, order=lean, step_id=step_id, user=order.user, tasks=places)
        # This node's supervisor starts while the peers start theirs (each costs an interpreter start).
        results = await asyncio.gather(
            self._start_local(lean, step_id, order.user, launch, places),
            *(self._ask_peer(peer, request) for peer in peers),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self._signal_everywhere(step, signal.SIGKILL)
            await sub.unsubscribe()
            self.coordinated.pop(key, None)
            sdir.file(COORD_FILE).unlink(missing_ok=True)  # nothing to watch after a restart
            raise errors[0]
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
        tmp = path.with_name(path.name + ".tmp")  # not with_suffix: <job>.<attempt> has a dot already
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
        key = (order.job_id, order.attempt, step_id)
        if not mine or key in self.local:
            return
        node_order = msgspec.structs.replace(order, node=self.node)
        alloc = next(a for a in order.allocations if a.node == self.node)
        job_env = job_environment(node_order, launch.environment, os.getuid())
        # The job's variables of this node (job_environment describes the batch node).
        gpus = ",".join(str(g) for g in alloc.gpus)
        job_env.update({"SLURM_CPUS_ON_NODE": str(alloc.cpus), "SLURM_GPUS_ON_NODE": str(len(alloc.gpus))})
        if gpus:
            job_env.update({"SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus})
        sdir = StepDir(self.root, key)
        sdir.create()
        cgroup = await self.cgroups.acquire(node_order, self.node)
        try:
            specs = [self._task_spec(sdir, order, step_id, launch, place, places, job_env) for place in mine]
            spec = StepSpec(
                user=user,
                key=launch.key,
                job_id=order.job_id,
                attempt=order.attempt,
                step_id=step_id,
                tasks=specs,
                cgroup_procs=_procs_file(cgroup.path),
                peer_cgroup=cgroup.peer,
                oom_base=cgroup.oom_base,
            )
            sdir.write_spec(spec)
        except BaseException:
            await self.cgroups.release(key[:2], cgroup)  # no step will run: a peer's cgroup may go
            raise
        local = LocalStep(
            user=user,
            key=launch.key,
            step=key,
            tasks=[p.task for p in mine],
            dir=sdir,
            cgroup=cgroup,
            spooled=sdir.spooled(spec),
        )
        self.local[key] = local
        # Started (and task 0's stdin subscribed) before the reply, so no stdin is lost.
        await self._start_stepd(local, spec)
        self._spawn(self._follow(local))

    @staticmethod
    def _task_spec(
        sdir: StepDir,
        order: LaunchOrder,
        step_id: int,
        launch: StepLaunch,
        place: TaskPlace,
        places: list[TaskPlace],
        job_env: dict[str, str],
    ) -> TaskSpec:
        """One task for the supervisor: output to the ``-o/-e`` files, else to spool files the agent tails."""
        append = launch.open_mode == "append"

        def target(pattern: str | None, kind: str) -> OutputTarget:
            if pattern is None:
                return OutputTarget(path=str(sdir.spool(kind, place.task)))
            path = steplayout.expand_step_pattern(pattern, order, step_id, place, launch.cwd)
            return OutputTarget(path=path, append=append)

        stdout = target(launch.stdout, "out")
        stderr = None if launch.stdout and not launch.stderr else target(launch.stderr, "err")
        return TaskSpec(
            task=place.task,
            argv=list(launch.argv),
            cwd=launch.cwd,
            env=steplayout.task_environment(job_env, place, places, step_id, launch),
            stdout=stdout,
            stderr=stderr,
            stdin=launch.stdin and place.task == 0,
        )

    async def _start_stepd(self, local: LocalStep, spec: StepSpec) -> None:
        """Start the step's supervisor here and wait for its handshake. If it fails, every task gets an exit
        file saying why (the follower reports them)."""
        stdin_r = None
        if any(t.stdin for t in spec.tasks):
            stdin_r, local.stdin_fd = os.pipe()
            os.set_blocking(local.stdin_fd, False)
        log = os.open(local.dir.file("stepd.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        argv = [sys.executable, "-I", "-S", stepd.__file__, str(local.dir.path)]
        try:
            # Its own session: it outlives the agent, and no signal to the agent's group reaches it.
            # (subprocess, not asyncio's: an asyncio subprocess transport kills its child when closed.)
            local.proc = subprocess.Popen(
                [*argv, *([str(stdin_r)] if stdin_r is not None else [])],
                cwd=local.dir.path,
                env={"PATH": os.defpath},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                pass_fds=() if stdin_r is None else (stdin_r,),
            )
        except OSError as exc:
            self._fail_tasks(local, f"cannot start the step's supervisor: {exc.strerror}")
            return
        finally:
            os.close(log)
            if stdin_r is not None:
                os.close(stdin_r)
        assert local.proc.stdout is not None
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), local.proc.stdout
        )
        self.reached("step.supervisor_started")
        try:
            line = (await asyncio.wait_for(reader.readline(), HANDSHAKE_S)).decode().strip()
        except TimeoutError:
            line = "error the step's supervisor did not answer"
        if line != "ok":
            transport.close()
            with contextlib.suppress(ProcessLookupError):
                local.proc.kill()
            await asyncio.to_thread(local.proc.wait)  # reaped: no zombie of it stays with the agent
            # what it started before it got stuck (it records each task's pid as it starts it) goes too
            local.pids = local.dir.pids()
            self._signal_pids(local, signal.SIGKILL)
            self._fail_tasks(local, line.removeprefix("error ") or "the step's supervisor failed")
            return
        local.pids = local.dir.pids()
        self.reached("step.started")
        self._spawn(self._listen(local, reader, transport))
        if local.stdin_fd is not None:
            local.stdin_sub = await self.nc.subscribe(
                io_subject(local.user, local.key, "in"), cb=functools.partial(self._feed, local)
            )

    def _fail_tasks(self, local: LocalStep, error: str) -> None:
        """Tasks that will never start: an exit file each (exit code 2, like a task that cannot exec)."""
        self.log.warning("step supervisor failed", step=local.step, error=error)
        for task in local.tasks:
            path = local.dir.file(f"{stepd.EXIT_PREFIX}{task}")
            if not path.exists():
                stepd.write_atomically(str(path), stepd.exit_json(2, 0, error))
        local.wake.set()

    @staticmethod
    async def _listen(local: LocalStep, reader: asyncio.StreamReader, transport: Any) -> None:
        """Wake the follower whenever the supervisor says a task ended (until it exits or we stop)."""
        try:
            while await reader.readline():
                local.wake.set()
        finally:
            transport.close()
            local.wake.set()

    async def _adopt(self, sdir: StepDir) -> None:
        """Take up a step a previous agent process left: follow its tasks (alive or not), and if this node
        coordinates it and its end is not recorded, watch it again."""
        spec = sdir.spec()
        coord = None if sdir.marked(COORD_EXITED) else sdir.coord()
        local = None
        if spec is not None:
            state = sdir.tail_state()
            local = LocalStep(
                user=spec.user,
                key=spec.key,
                step=sdir.key,
                tasks=[t.task for t in spec.tasks],
                dir=sdir,
                pids=sdir.pids(),
                offsets=dict(state.offsets),
                spooled=sdir.spooled(spec),
            )
            for task in state.reported:
                local.exits[task] = sdir.exit_of(task, self.node) or _vanished(task, self.node)
            cgroup = os.path.dirname(spec.cgroup_procs) if spec.cgroup_procs else None
            local.cgroup = self.cgroups.adopted(sdir.key[:2], cgroup, spec.peer_cgroup, spec.oom_base)
            self.local[sdir.key] = local
        if coord is not None:
            step = Coordinated(
                order=coord.order,
                step_id=coord.step_id,
                launch=coord.launch,
                places=coord.places,
                dir=sdir,
                resumed=True,
            )
            for exit in local.exits.values() if local is not None else ():
                self._note_exit(step, exit)
            self.coordinated[sdir.key] = step
            sub = await self.nc.subscribe(
                io_subject(coord.order.user, coord.launch.key, "exit", None) + ".*",
                cb=functools.partial(self._on_exit, step),
            )
            self._spawn(self._watch(step, sub))
        if local is None:
            if coord is None:
                sdir.remove()
            return
        self.log.info("step adopted", step=sdir.key, reported=len(local.exits), tasks=local.ntasks)
        self._spawn(self._follow(local))
        if killseq.requested(str(sdir.path)) is not None and len(local.exits) < local.ntasks:
            self._signal_tasks(local, signal.SIGKILL)  # asked again: the agent may have stopped first

    def _stepd_alive(self, local: LocalStep) -> bool:
        if local.proc is not None:
            return local.proc.poll() is None  # (reaps it once it ended)
        if local.pids is None:
            local.pids = local.dir.pids()  # adopted before its supervisor had written them
        return local.pids is not None and stepdir.running(local.pids.stepd)

    async def _follow(self, local: LocalStep) -> None:
        """Forward the tasks' spool output to srun, then each task's exit, until every exit is out; from
        where the previous agent process stopped, if it was one. Offsets are saved only after the output
        was flushed to NATS: a restart may repeat a little output, never lose any."""
        loop = asyncio.get_running_loop()
        files: dict[str, Any] = {}
        saved_at = loop.time()
        dirty = False
        try:
            while len(local.exits) < local.ntasks:
                local.wake.clear()
                # In this order: an exit file is written after its task ended, so once it is seen every
                # byte of the task's output is in its spool file; a supervisor seen gone wrote all it will.
                alive = self._stepd_alive(local)
                new = [
                    e
                    for t in local.tasks
                    if t not in local.exits and (e := local.dir.exit_of(t, self.node)) is not None
                ]
                dirty = await self._tail(local, files) or dirty
                if not alive:
                    new += self._vanished_exits(local, {e.task for e in new})
                new = StepCgroups.with_oom(local.cgroup, new)
                if dirty and (new or loop.time() - saved_at >= SAVE_S):
                    await self._flush()
                    self._save(local)
                    saved_at, dirty = loop.time(), False
                    await asyncio.to_thread(_reclaim, local)
                for exit in new:
                    await self._publish_exit(local, exit)
                if new:
                    await self._flush()  # one round trip for the exits seen together
                    self._save(local)
                if len(local.exits) < local.ntasks:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(local.wake.wait(), TAIL_S)
        finally:
            for fh in files.values():
                fh.close()
        self._close_stdin(local)
        if local.stdin_sub is not None:
            with contextlib.suppress(Exception):
                await local.stdin_sub.unsubscribe()
        if local.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(local.proc.wait, 5)  # it exits right after the last exit
        local.finished.set()
        self._release_local(local)

    def _vanished_exits(self, local: LocalStep, seen: set[int]) -> list[TaskExit]:
        """The exits of tasks whose supervisor is gone without writing them: killed (what is left of them
        is killed now, so that is true)."""
        lost = [t for t in local.tasks if t not in local.exits and t not in seen]
        pids = local.pids.tasks if local.pids is not None else {}
        for task in lost:
            if str(task) in pids and stepdir.running(pids[str(task)]):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pids[str(task)][0], signal.SIGKILL)
        return [_vanished(task, self.node) for task in lost]

    async def _tail(self, local: LocalStep, files: dict[str, Any]) -> bool:
        """Publish what the spool files gained since the last look; True if anything."""
        published = False
        for task in local.tasks:
            if task in local.exits:
                continue
            for kind in ("out", "err"):
                name = f"{kind}.{task}"
                if local.spooled is not None and name not in local.spooled:
                    continue  # an -o/-e file: its task writes it itself
                fh = files.get(name)
                if fh is None:
                    try:
                        fh = open(local.dir.file(name), "rb", buffering=0)  # noqa: SIM115 (kept open)
                    except FileNotFoundError:
                        continue  # not created yet
                    fh.seek(local.offsets.get(name, 0))
                    files[name] = fh
                subject = io_subject(local.user, local.key, kind, task)
                while chunk := fh.read(_CHUNK):
                    with contextlib.suppress(Exception):
                        await self.nc.publish(subject, chunk)
                    local.offsets[name] = local.offsets.get(name, 0) + len(chunk)
                    published = True
        return published

    async def _flush(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.flush()

    @staticmethod
    def _save(local: LocalStep) -> None:
        with contextlib.suppress(OSError):
            local.dir.write_tail_state(TailState(offsets=local.offsets, reported=sorted(local.exits)))

    async def _feed(self, local: LocalStep, msg: Msg) -> None:
        """Write srun's stdin to task 0 (an empty message closes it)."""
        fd = local.stdin_fd
        if fd is None:
            return
        if not msg.data:
            self._close_stdin(local)
            return
        data = msg.data
        while data and local.stdin_fd == fd:
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                await asyncio.sleep(0.01)  # the task reads slowly: the pipe is full
            except OSError:
                self._close_stdin(local)  # it closed its stdin, or ended
                return

    @staticmethod
    def _close_stdin(local: LocalStep) -> None:
        if local.stdin_fd is not None:
            with contextlib.suppress(OSError):
                os.close(local.stdin_fd)
            local.stdin_fd = None

    async def _publish_exit(self, local: LocalStep, exit: TaskExit) -> None:
        local.exits[exit.task] = exit
        coordinated = self.coordinated.get(local.step)
        if coordinated is not None:
            self._note_exit(coordinated, exit)  # this node coordinates the step: no round trip
        with contextlib.suppress(Exception):
            await self.nc.publish(
                io_subject(local.user, local.key, "exit", exit.task), msgspec.json.encode(exit)
            )

    def _release_local(self, local: LocalStep) -> None:
        """This node's part is over. A peer keeps the exits a while for the coordinator's poll, then forgets
        the step; the coordinator forgets it once its end is recorded (see ``_watch``). A peer's run cgroup
        goes with the run's last step here."""
        cgroup, local.cgroup = local.cgroup, StepCgroup(None, False)
        self._spawn(self.cgroups.release(local.step[:2], cgroup))
        if local.dir.marked(COORD_EXITED):
            self._forget(local)
        elif not local.dir.file(COORD_FILE).exists():
            asyncio.get_running_loop().call_later(KEEP_S, self._forget, local)

    def _forget(self, local: LocalStep) -> None:
        if self.local.get(local.step) is local:
            del self.local[local.step]
            local.dir.remove()

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
        ids = f"{order.job_id}:{order.attempt}:{step.step_id}:{self.node}"
        if not step.dir.marked(COORD_STARTED):
            await self._append_step_started(step, nodes, ids)
        await self._watch_until_done(step)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if not step.killed and self.orders(order.job_id) is None:
            # Its tasks ended as their run was being killed (srun passes the run's SIGTERM on to them).
            step.killed = True
        exits = list(step.exits.values())
        if any(e.oom for e in exits):
            # Recorded in the run's directory, so the run's exit says so even after an agent restart.
            with contextlib.suppress(OSError):
                (self.run_dir(order.job_id, order.attempt) / STEP_OOM_FILE).touch()
        await self.append(
            ev.StepExited(
                job_id=order.job_id,
                attempt=order.attempt,
                step_id=step.step_id,
                node=self.node,
                exit_code=max((e.exit_code for e in exits), default=0),
                signal=max((e.signal for e in exits), default=signal.SIGKILL if step.killed else 0),
                killed=step.killed,
                oom=any(e.oom for e in exits),
            ),
            msg_id=f"step-exited:{ids}",  # once, also when a restarted agent appends it again
        )
        step.dir.mark(COORD_EXITED)
        key = (order.job_id, order.attempt, step.step_id)
        self.coordinated.pop(key, None)
        local = self.local.get(key)
        if local is None:
            step.dir.remove()
        elif local.finished.is_set():
            self._forget(local)

    async def _append_step_started(self, step: Coordinated, nodes: list[str], ids: str) -> None:
        order = step.order
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
            ),
            msg_id=f"step-started:{ids}",
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
                None if step.done.is_set() else self.orders(order.job_id)
            )  # decoded afresh: compare runs
            if not step.done.is_set() and (current is None or current.attempt != order.attempt):
                # The run ended (or was replaced): its steps end with it, on every node.
                step.killed = True
                self._signal_everywhere(step, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(step.done.wait(), self.kill_wait + 5)
                break

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

    def had_oom(self, job_id: int, attempt: int) -> bool:
        """Whether a step of the run this node coordinates had a task OOM-killed (the job ends OOM)."""
        return (self.run_dir(job_id, attempt) / STEP_OOM_FILE).exists()

    def cgroups_in_use(self) -> set[str]:
        """The memory cgroups the tasks of this node's step directories joined (kept by the start sweep)."""
        out = set()
        for sdir in StepDir.all(self.root):
            spec = sdir.spec()
            if spec is not None and spec.cgroup_procs:
                out.add(os.path.dirname(spec.cgroup_procs))
        return out

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
                self._kill_sequence(local)
            return
        self._signal_pids(local, sig)

    def _live_tasks(self, local: LocalStep) -> list[int]:
        """Process groups of this node's tasks of the step still running (pid and start ticks on disk)."""
        if local.pids is None:
            local.pids = local.dir.pids()
        if local.pids is None:
            return []
        return [pid for pid, ticks in local.pids.tasks.values() if stepdir.running((pid, ticks))]

    def _signal_pids(self, local: LocalStep, sig: int) -> None:
        for pgid in self._live_tasks(local):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)

    def _kill_sequence(self, local: LocalStep, grace: float | None = None) -> None:
        """Have the step's supervisor run its kill sequence (killseq.py: the same as a batch script's); a
        supervisor that is gone leaves its tasks to be killed at once."""
        if local.pids is None:
            local.pids = local.dir.pids()
        stepd_pid = local.pids.stepd[0] if local.pids is not None and self._stepd_alive(local) else 0
        with contextlib.suppress(OSError):
            wait = self.kill_wait if grace is None else grace
            if stepd_pid and killseq.request(str(local.dir.path), wait, stepd_pid):
                return
        self._signal_pids(local, signal.SIGKILL)

    def kill_step_here(self, key: tuple[int, int, int], grace: float | None = None) -> None:
        """Start the kill sequence of this node's tasks of a step (once)."""
        local = self.local.get(key)
        if local is not None and not local.killing:
            local.killing = True
            self._kill_sequence(local, grace)

    async def end_run(self, job_id: int, attempt: int, grace: float | None = None) -> None:
        """End this node's processes of a run: every step of it here gets the kill sequence (``grace``, else
        KillWait), and this returns once each step's supervisor is gone, i.e. nothing of the run is left
        here (or, at worst, KillWait and a margin later). On an agent restart, after the steps are adopted."""
        await self.ready.wait()
        steps = [s for (job, run, _), s in list(self.local.items()) if (job, run) == (job_id, attempt)]
        for local in steps:
            if not local.finished.is_set() or self._stepd_alive(local):
                self.kill_step_here(local.step, grace)
        deadline = asyncio.get_running_loop().time() + (self.kill_wait if grace is None else grace) + 10
        for local in steps:
            while asyncio.get_running_loop().time() < deadline and (
                not local.finished.is_set() or self._stepd_alive(local)
            ):
                await asyncio.sleep(0.05)

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
        """Stop following the steps and leave their tasks running: each runs under its supervisor, and the
        next agent process re-adopts them (``start``). Task 0's stdin (a pipe held here) sees end of file."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _reclaim(local: LocalStep) -> None:
    """Free the disk space of what was published and saved of each spool file, a MiB or more at a time
    (``holes.py``): a long, chatty step keeps only its unpublished output on the node's disk."""
    for name, offset in local.offsets.items():
        if offset - local.punched.get(name, 0) >= RECLAIM_BYTES and holes.punch(local.dir.file(name), offset):
            local.punched[name] = offset


def _lost(place: TaskPlace) -> TaskExit:
    """The exit of a task whose node forgot the step (it never got it, or forgot it long ago): killed."""
    return TaskExit(
        task=place.task,
        node=place.node,
        exit_code=0,
        signal=signal.SIGKILL,
        error=f"node {place.node}: the task was lost (its node no longer knows the step)",
    )


def _vanished(task: int, node: str) -> TaskExit:
    """The exit of a task whose supervisor is gone without recording it: killed."""
    return TaskExit(
        task=task,
        node=node,
        exit_code=0,
        signal=signal.SIGKILL,
        error=f"node {node}: the task's step supervisor vanished",
    )


def _procs_file(cgroup: str | None) -> str | None:
    """The ``cgroup.procs`` file a task writes itself into to join ``cgroup`` (None: no cgroup)."""
    return None if cgroup is None else os.path.join(cgroup, memcg.PROCS)
