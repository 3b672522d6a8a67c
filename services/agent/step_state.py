"""What the agent knows of the steps on its node: this node's tasks of each step (``LocalStep``), the steps
this (batch) node coordinates (``Coordinated``), the table of both, and the narrow interfaces the step
modules need from the rest of the agent (``RunsView``, ``Appender``, ``CrashPoint``).

Steps are keyed by (job, attempt, step): a requeued job's new run numbers its steps from 0 again, and the
old run's steps must not be confused with them (an old step's kill must not reach a new one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from corral.schemas import events as ev
from corral.schemas.api import LaunchOrder
from corral.schemas.steps import StepLaunch, TaskExit, TaskPlace
from corral.services.agent import stepdir
from corral.services.agent.step_cgroups import StepCgroup
from corral.services.agent.stepdir import StepDir, StepPids
from corral.services.agent.supervisor import Supervisor

#: Files of a step directory (stepdir.py) the coordinator's side uses.
COORD_FILE = "coord.json"
COORD_STARTED = "coord.started"
COORD_EXITED = "coord.exited"
#: How many ended steps a node keeps answering a repeated launch for (``StepTable.ended``).
ENDED_KEPT = 1024
#: The run directory's marker: a step of the run had a task OOM-killed (the run's exit reports ``oom``).
STEP_OOM_FILE = "step_oom"

StepKey = tuple[int, int, int]


class RunsView(Protocol):
    """What the steps need of the node's runs table."""

    def running_order(self, job_id: int) -> LaunchOrder | None:
        """The launch order of the job's run running on this node, if any."""

    def run_dir(self, job_id: int, attempt: int) -> Path:
        """The run's directory (where its script is)."""

    def latest_attempt(self, job_id: int) -> int:
        """The newest attempt of the job this node has seen (-1: none)."""


class Appender(Protocol):
    """Appends an event to the log (retrying until the log takes it)."""

    async def append(
        self,
        body: ev.Event,
        msg_id: str | None = None,
        traceparent: str | None = None,
        cause: str | None = None,
    ) -> None:
        """Append ``body``, deduplicated by ``msg_id``, in the trace ``traceparent`` names, caused by
        the event id ``cause``."""


class CrashPoint(Protocol):
    """A crash point of a launch (failure tests: crashpoints.py)."""

    def reached(self, name: str) -> None:
        """The launch reached ``name``."""


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
    step: StepKey  # (job, attempt, step id)
    tasks: list[int]  # this node's task ids
    dir: StepDir  # where its supervisor and the agent keep what outlives the agent
    pids: StepPids | None = None  # the supervisor's and the tasks' pids, once known
    exits: dict[int, TaskExit] = field(default_factory=dict)  # task id -> exit, published
    offsets: dict[str, int] = field(default_factory=dict)  # spool file -> bytes published
    punched: dict[str, int] = field(default_factory=dict)  # spool file -> bytes whose disk space was freed
    spooled: set[str] | None = None  # the spool files its tasks write (not -o/-e files); None: unknown
    proc: Supervisor | None = None  # the supervisor, when this agent process started it
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

    def stepd_alive(self) -> bool:
        """Whether the step's supervisor still runs."""
        if self.proc is not None:
            return self.proc.alive()
        if self.pids is None:
            self.pids = self.dir.pids()  # adopted before its supervisor had written them
        return self.pids is not None and stepdir.running(self.pids.stepd)

    def live_tasks(self) -> list[int]:
        """Process groups of this node's tasks of the step still running (pid and start ticks on disk)."""
        if self.pids is None:
            self.pids = self.dir.pids()
        if self.pids is None:
            return []
        return [pid for pid, ticks in self.pids.tasks.values() if stepdir.running((pid, ticks))]

    def signal_pids(self, sig: int) -> None:
        """Send ``sig`` to the process group of each task still running (to the task itself if it was
        caught between its fork and its ``setsid``, before its group existed)."""
        for pgid in self.live_tasks():
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pgid, sig)
            except PermissionError:
                pass


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
    # Its launch is over: its tasks started on every node, or it failed with ``failure``. A resumed step's
    # is set from the start (it started under the previous agent process).
    launched: asyncio.Event = field(default_factory=asyncio.Event)
    failure: BaseException | None = None  # why its launch failed
    killed: bool = False  # killed by srun (SIGKILL) or because the run ended

    @classmethod
    def resumed_from(cls, sdir: StepDir, record: stepdir.CoordRecord) -> Coordinated:
        """The step a previous agent process coordinated, from its directory's record (launched by then)."""
        step = cls(
            order=record.order,
            step_id=record.step_id,
            launch=record.launch,
            places=record.places,
            dir=sdir,
            resumed=True,
        )
        step.launched.set()
        return step

    def note_exit(self, exit: TaskExit) -> None:
        """A task of the step exited (from its node, a poll, or this node's own follower)."""
        if any(p.task == exit.task for p in self.places):
            self.exits[exit.task] = exit
        if len(self.exits) >= len(self.places):
            self.done.set()


@dataclass
class StepTable:
    """The steps of this node: its own tasks of each, and those it coordinates."""

    local: dict[StepKey, LocalStep] = field(default_factory=dict)  # this node's tasks, by step
    coordinated: dict[StepKey, Coordinated] = field(default_factory=dict)  # steps this node coordinates
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # a previous agent's steps are adopted
    # The last ``ENDED_KEPT`` steps this node coordinated that have ended, by srun's launch key: a launch
    # asked again after its step ended (its first answer was lost) is answered with that step, not run again.
    ended: dict[str, Coordinated] = field(default_factory=dict)

    def launched(self, key: str, job_id: int, attempt: int) -> Coordinated | None:
        """The step this node coordinates (or did, lately) for srun's launch ``key`` of the run, if any."""
        for step in (*self.coordinated.values(), self.ended.get(key)):
            run = (step.order.job_id, step.order.attempt) if step is not None else None
            if step is not None and step.launch.key == key and run == (job_id, attempt):
                return step
        return None

    def remember_ended(self, step: Coordinated) -> None:
        """The step ended: keep it for a launch asked again (the oldest is dropped past ``ENDED_KEPT``)."""
        self.ended.pop(step.launch.key, None)
        self.ended[step.launch.key] = step
        while len(self.ended) > ENDED_KEPT:
            del self.ended[next(iter(self.ended))]

    def forget(self, local: LocalStep) -> None:
        """This node is done with its tasks of the step: drop it and its directory."""
        if self.local.get(local.step) is local:
            del self.local[local.step]
            local.dir.remove()

    def of_run(self, job_id: int, attempt: int) -> list[LocalStep]:
        """This node's steps of a run."""
        return [s for (job, run, _), s in list(self.local.items()) if (job, run) == (job_id, attempt)]


def lost(place: TaskPlace) -> TaskExit:
    """The exit of a task whose node forgot the step (it never got it, or forgot it long ago): killed."""
    return TaskExit(
        task=place.task,
        node=place.node,
        exit_code=0,
        signal=signal.SIGKILL,
        error=f"node {place.node}: the task was lost (its node no longer knows the step)",
    )


def vanished(task: int, node: str) -> TaskExit:
    """The exit of a task whose supervisor is gone without recording it: killed."""
    return TaskExit(
        task=task,
        node=node,
        exit_code=0,
        signal=signal.SIGKILL,
        error=f"node {node}: the task's step supervisor vanished",
    )


def task_outcomes(exits: list[TaskExit], ntasks: int) -> tuple[list[ev.TaskOutcome], int]:
    """The outcomes of a step's tasks for ``StepExited`` within its bounds (``ev.MAX_STEP_TASKS`` outcomes
    and ``ev.MAX_STEP_TASKS_BYTES`` of JSON), the failed tasks kept first, then the lowest ranks; by rank,
    and how many of its ``ntasks`` are left out (those cut, and those whose exit never came)."""
    outcomes = [
        ev.TaskOutcome(
            rank=e.task,
            node=e.node,
            pid=e.pid,
            started_at=e.started_at,
            ended_at=e.ended_at,
            exit_code=e.exit_code,
            signal=e.signal,
            oom=e.oom,
            error=e.error[: ev.MAX_TASK_ERROR],
        )
        for e in exits
    ]
    outcomes.sort(key=lambda o: (not (o.exit_code or o.signal or o.oom or o.error), o.rank))
    kept: list[ev.TaskOutcome] = []
    size = 2  # the list's brackets
    for outcome in outcomes[: ev.MAX_STEP_TASKS]:
        size += len(msgspec.json.encode(outcome)) + 1  # and its comma
        if size > ev.MAX_STEP_TASKS_BYTES:
            break
        kept.append(outcome)
    return sorted(kept, key=lambda o: o.rank), max(ntasks, len(outcomes)) - len(kept)
