"""This node's tasks of a step: started under a detached supervisor of their own (``stepd.py``, one per
step and node, Slurm's slurmstepd), so they outlive the agent; signalled and killed through it.

The agent writes the step's directory (``stepdir.py``: the tasks' argv, cwd, environment - the job's plus
the task's, ``steplayout.task_environment`` - output files, and the job owner they run as, looked up on
this node: ``identity.py``; an owner this node cannot run as gets every task's exit at once, saying why),
starts the supervisor, which starts each task in its own session and records pids and exits there, and
waits for its handshake. Signals reach tasks
by the process groups recorded on disk, checked against their start ticks; SIGKILL from srun is the
supervisor's kill sequence (``killseq.py``, the same as a batch script's).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from pathlib import Path

import msgspec
from nats.aio.client import Client

from corral.libs.runtime import telemetry
from corral.schemas.api import LaunchOrder
from corral.schemas.steps import StepLaunch, TaskPlace, io_subject
from corral.services.agent import killseq, memcg, stepd, steplayout
from corral.services.agent.background import Background
from corral.services.agent.identity import Identities, JobUser, UnknownIdentity
from corral.services.agent.jobenv import NodeEnv, job_environment
from corral.services.agent.runtmp import RunTmp
from corral.services.agent.step_cgroups import StepCgroups
from corral.services.agent.step_output import StepOutput, listen
from corral.services.agent.step_state import CrashPoint, LocalStep, StepKey, StepTable, vanished
from corral.services.agent.stepdir import OutputTarget, StepDir, StepSpec, TaskSpec
from corral.services.agent.supervisor import Supervisors

#: Seconds a step's supervisor may take to start the tasks and answer.
HANDSHAKE_S = 30.0


class StepLocal:
    """Starts, adopts, signals and kills this node's tasks of each step."""

    def __init__(
        self,
        nc: Client,
        node: str,
        root: Path,
        kill_wait: float,
        table: StepTable,
        cgroups: StepCgroups,
        output: StepOutput,
        crash: CrashPoint,
        background: Background,
        identities: Identities,
        tmp: RunTmp | None = None,
        supervisors: Supervisors | None = None,
    ) -> None:
        self.nc = nc
        self.node = node
        self.root = root  # step directories (stepdir.py)
        self.kill_wait = kill_wait  # seconds between SIGTERM and SIGKILL, unless told otherwise
        self.table = table  # the node's steps
        self.cgroups = cgroups  # the memory cgroups tasks join
        self.output = output  # forwards the tasks' output and exits
        self.crash = crash  # a crash point of a step's launch (failure tests: crashpoints.py)
        self.background = background  # where each step is followed
        self.identities = identities  # who the job runs as here (its owner)
        self.tmp = tmp  # each run's TMPDIR here, and what else the node adds to the tasks' environment
        # starts the steps' supervisors (the node's fork server; without one, each a new interpreter)
        self.supervisors = supervisors or Supervisors(root, fork=False)
        self.log = telemetry.logger(node=node)

    async def start(
        self, order: LaunchOrder, step_id: int, user: str, launch: StepLaunch, places: list[TaskPlace]
    ) -> None:
        """Start this node's tasks of a step (none, or already started: nothing) and follow them."""
        mine = [p for p in places if p.node == self.node]
        key = (order.job_id, order.attempt, step_id)
        if not mine or key in self.table.local:
            return
        node_order = msgspec.structs.replace(order, node=self.node)
        try:
            owner: JobUser | None = await asyncio.to_thread(self.identities.of, order.user)
            refused = None
        except UnknownIdentity as exc:
            owner, refused = None, str(exc)  # the tasks fail to start, saying why; nothing runs
        uid, gid = (owner.uid, owner.gid) if owner is not None else (-1, -1)
        # The run's TMPDIR here is made by its first step on a node that runs no batch script of it.
        node_env = NodeEnv()
        if self.tmp is not None:
            node_env = self.tmp.env
            if owner is not None and self.tmp.root is not None:
                node_env = await asyncio.to_thread(self.tmp.node_env, order.job_id, order.attempt, owner)
        job_env = job_environment(node_order, launch.environment, uid, gid, node_env)
        sdir = StepDir(self.root, key)
        sdir.create()
        cgroup = await self.cgroups.acquire(node_order, self.node)
        try:
            specs = [_task_spec(sdir, order, step_id, launch, place, places, job_env) for place in mine]
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
                run_as=owner.run_as() if owner is not None else None,
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
        self.table.local[key] = local
        if refused is not None:
            self._fail_tasks(local, refused)
        else:
            # Started (and task 0's stdin subscribed) before the reply, so no stdin is lost.
            await self._start_stepd(local, spec)
        self.background.spawn(self.output.follow(local))

    async def _start_stepd(self, local: LocalStep, spec: StepSpec) -> None:
        """Start the step's supervisor here and wait for its handshake. If it fails, every task gets an exit
        file saying why (the follower reports them)."""
        stdin_r = None
        if any(t.stdin for t in spec.tasks):
            stdin_r, local.stdin_fd = os.pipe()
            os.set_blocking(local.stdin_fd, False)
        log = os.open(local.dir.file("stepd.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            local.proc = await self.supervisors.start(local.dir.path, log, stdin_r, {"PATH": os.defpath})
        except OSError as exc:
            self._fail_tasks(local, f"cannot start the step's supervisor: {exc.strerror}")
            return
        finally:
            os.close(log)
            if stdin_r is not None:
                os.close(stdin_r)
        reader = await local.proc.reader()
        self.crash.reached("step.supervisor_started")
        try:
            line = (await asyncio.wait_for(reader.readline(), HANDSHAKE_S)).decode().strip()
        except TimeoutError:
            line = "error the step's supervisor did not answer"
        if line != "ok":
            local.proc.close_stdout()
            local.proc.kill()
            await local.proc.wait()
            # what it started before it got stuck (it records each task's pid as it starts it) goes too
            local.pids = local.dir.pids()
            local.signal_pids(signal.SIGKILL)
            self._fail_tasks(local, line.removeprefix("error ") or "the step's supervisor failed")
            return
        local.pids = local.dir.pids()
        self.crash.reached("step.started")
        self.background.spawn(listen(local, reader, local.proc))
        if local.stdin_fd is not None:
            local.stdin_sub = await self.nc.subscribe(
                io_subject(local.user, local.key, "in", None, self.node),
                cb=functools.partial(self.output.feed, local),
            )

    def _fail_tasks(self, local: LocalStep, error: str) -> None:
        """Tasks that will never start: an exit file each (exit code 2, like a task that cannot exec)."""
        self.log.warning("step supervisor failed", step=local.step, error=error)
        for task in local.tasks:
            path = local.dir.file(f"{stepd.EXIT_PREFIX}{task}")
            if not path.exists():
                stepd.write_atomically(str(path), stepd.exit_json(2, 0, error))
        local.wake.set()

    def adopt(self, sdir: StepDir, spec: StepSpec) -> LocalStep:
        """This node's tasks of a step a previous agent process left (alive or not), in the table."""
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
            local.exits[task] = sdir.exit_of(task, self.node) or vanished(task, self.node)
        cgroup = os.path.dirname(spec.cgroup_procs) if spec.cgroup_procs else None
        local.cgroup = self.cgroups.adopted(sdir.key[:2], cgroup, spec.peer_cgroup, spec.oom_base)
        self.table.local[sdir.key] = local
        return local

    def follow_adopted(self, local: LocalStep) -> None:
        """Follow an adopted step again; a kill asked of it before is asked again."""
        self.log.info("step adopted", step=local.step, reported=len(local.exits), tasks=local.ntasks)
        self.background.spawn(self.output.follow(local))
        if killseq.requested(str(local.dir.path)) is not None and len(local.exits) < local.ntasks:
            self.signal_tasks(local, signal.SIGKILL)  # asked again: the agent may have stopped first

    def signal(self, job_id: int, attempt: int | None, step_id: int, sig: int, raw: bool = False) -> None:
        """Signal this node's tasks of a step of that run (of any run for ``attempt`` None: an old agent)."""
        for (job, run, step), local in list(self.table.local.items()):
            if (job, step) == (job_id, step_id) and attempt in (None, run):
                self.signal_tasks(local, sig, raw)

    def signal_tasks(self, local: LocalStep, sig: int, raw: bool = False) -> None:
        """Signal a step's tasks here; srun's SIGKILL (not ``raw``) is the kill sequence."""
        if sig == signal.SIGKILL and not raw:
            if not local.killing:
                local.killing = True
                self._kill_sequence(local)
            return
        local.signal_pids(sig)

    def _kill_sequence(self, local: LocalStep, grace: float | None = None) -> None:
        """Have the step's supervisor run its kill sequence (killseq.py: the same as a batch script's); a
        supervisor that is gone leaves its tasks to be killed at once."""
        if local.pids is None:
            local.pids = local.dir.pids()
        stepd_pid = local.pids.stepd[0] if local.pids is not None and local.stepd_alive() else 0
        with contextlib.suppress(OSError):
            wait = self.kill_wait if grace is None else grace
            if stepd_pid and killseq.request(str(local.dir.path), wait, stepd_pid):
                return
        local.signal_pids(signal.SIGKILL)

    def kill_here(self, key: StepKey, grace: float | None = None) -> None:
        """Start the kill sequence of this node's tasks of a step (once)."""
        local = self.table.local.get(key)
        if local is not None and not local.killing:
            local.killing = True
            self._kill_sequence(local, grace)

    async def end_run(self, job_id: int, attempt: int, grace: float | None = None) -> None:
        """End this node's processes of a run: every step of it here gets the kill sequence (``grace``, else
        KillWait), and this returns once each step's supervisor is gone, i.e. nothing of the run is left
        here (or, at worst, KillWait and a margin later). On an agent restart, after the steps are adopted."""
        await self.table.ready.wait()
        steps = self.table.of_run(job_id, attempt)
        for local in steps:
            if not local.finished.is_set() or local.stepd_alive():
                self.kill_here(local.step, grace)
        deadline = asyncio.get_running_loop().time() + (self.kill_wait if grace is None else grace) + 10
        for local in steps:
            while asyncio.get_running_loop().time() < deadline and (
                not local.finished.is_set() or local.stepd_alive()
            ):
                await asyncio.sleep(0.05)


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
            return OutputTarget(path=str(sdir.spool(kind, place.task)), private=True)
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


def _procs_file(cgroup: str | None) -> str | None:
    """The ``cgroup.procs`` file a task writes itself into to join ``cgroup`` (None: no cgroup)."""
    return None if cgroup is None else os.path.join(cgroup, memcg.PROCS)
