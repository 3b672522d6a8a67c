"""A step's directory on a node: everything its supervisor (stepd.py) and a restarted agent need, on disk.

``<agent state>/stepd/<job>.<attempt>.<step>/`` (0700), one per step on each node that has tasks of it
(and on the batch node, which coordinates the step, also its coordination record):

=================  ============  ===================================================================
file               written by    what
=================  ============  ===================================================================
``step.spec``      agent (0600)  ``StepSpec`` (marshal): this node's tasks (argv, cwd, env, outputs, user)
``pids``           stepd         ``{"stepd": [pid, ticks], "tasks": {"<task>": [pid, ticks]}}``
``exit.<task>``    stepd         ``{"exit_code", "signal", "error", "pid", "started_at", "ended_at"}``
``out.<task>``     the task      its stdout when srun gets it (no ``-o``): the agent tails it
``err.<task>``     the task      its stderr likewise (no ``-e``; with ``-o`` alone it goes to ``-o``)
``stepd.log``      stepd         the supervisor's own stderr (tracebacks)
``tail.json``      agent         ``TailState``: how far each spool file was published, exits reported
``killing``        agent         the kill sequence began (a restarted agent finishes it)
``coord.json``     batch agent   ``CoordRecord``: the step's order, launch and layout (to watch it)
``coord.started``  batch agent   ``StepStarted`` was appended
``coord.exited``   batch agent   ``StepExited`` was appended
=================  ============  ===================================================================

An exit file is written by rename once its task ended; its times are the node's wall clock (seconds).
Start ticks (``procstat.py``) come with every pid: a signal goes to a task's process group only
while the process recorded is the one running on that pid.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import shutil
from pathlib import Path
from typing import TypeVar

import msgspec

from corral.schemas.api import LaunchOrder
from corral.schemas.steps import StepLaunch, TaskExit, TaskPlace
from corral.services.agent import procstat, stepd

_T = TypeVar("_T")

#: How a step directory is named: ``<job>.<attempt>.<step>``.
StepKey = tuple[int, int, int]
#: The step id of the batch step (Slurm's ``<job>.batch``), which lives in its run's directory.
BATCH_STEP = -1


class OutputTarget(msgspec.Struct, frozen=True, kw_only=True):
    """A file a task writes to."""

    path: str  # absolute path
    append: bool = False  # --open-mode=append (else truncated)
    private: bool = (
        False  # a spool file of the step directory: opened by the supervisor, not as the job's user
    )


class RunAs(msgspec.Struct, frozen=True, kw_only=True):
    """The identity a supervisor gives the tasks between fork and exec (groups, then gid, then uid)."""

    uid: int  # the job owner's uid
    gid: int  # their primary group
    groups: list[int]  # their supplementary groups (initgroups' list)


class TaskSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One task as the supervisor starts it."""

    task: int  # SLURM_PROCID
    argv: list[str]  # the command
    cwd: str  # its directory
    env: dict[str, str]  # its whole environment
    stdout: OutputTarget  # -o file, or the spool file
    stderr: OutputTarget | None = None  # -e file or the spool file; None = with stdout
    stdin: bool = False  # gets the supervisor's stdin descriptor (task 0 with srun's stdin)


class StepSpec(msgspec.Struct, frozen=True, kw_only=True):
    """``step.spec``: this node's part of a step."""

    user: str  # the job's owner (I/O subjects)
    key: str  # the step's I/O token
    job_id: int  # job
    attempt: int  # run
    step_id: int  # step
    tasks: list[TaskSpec]  # this node's tasks
    cgroup_procs: str | None = None  # ``cgroup.procs`` of the run's memory cgroup the tasks join, if any
    peer_cgroup: bool = False  # that cgroup is a peer's run cgroup (step_cgroups.py), not the batch run's
    oom_base: int = 0  # the cgroup's OOM kill count when the step started (an adopted step compares with it)
    batch: bool = False  # the batch step: the run's script, in its run directory; it owns the run's cgroup
    run_as: RunAs | None = None  # the job owner the tasks run as (None: the agent's own user, the owner)


class CoordRecord(msgspec.Struct, frozen=True, kw_only=True):
    """``coord.json``: what the batch node's agent needs to keep watching a step after a restart."""

    order: LaunchOrder  # the run's launch order (without script and submit environment)
    step_id: int  # the step's number
    launch: StepLaunch  # what srun asked for
    places: list[TaskPlace]  # every task of the step


class TailState(msgspec.Struct, kw_only=True):
    """``tail.json``: the agent's progress (offsets only after the output was flushed to NATS)."""

    offsets: dict[str, int] = {}  # spool file name -> bytes published
    reported: list[int] = []  # tasks whose exit was published


class StepPids(msgspec.Struct, frozen=True, kw_only=True):
    """``pids``: who runs the step here."""

    stepd: tuple[int, int]  # supervisor pid, start ticks
    tasks: dict[str, tuple[int, int]] = {}  # task -> (pid = process group, start ticks)


class _Exit(msgspec.Struct, frozen=True):
    exit_code: int
    signal: int = 0
    error: str = ""
    pid: int = 0  # 0: not started, or written by an older supervisor
    started_at: float = 0.0
    ended_at: float = 0.0


class StepDir:
    """The directory of one step on this node."""

    def __init__(self, root: Path, key: StepKey) -> None:
        self.key = key
        self.path = root / ".".join(map(str, key))

    @classmethod
    def batch(cls, run_dir: Path, job_id: int, attempt: int) -> StepDir:
        """The batch step's directory: the run's own (``<agent state>/jobs/<job>.<attempt>/``)."""
        sdir = cls(run_dir.parent, (job_id, attempt, BATCH_STEP))
        sdir.path = run_dir
        return sdir

    @staticmethod
    def all(root: Path) -> list[StepDir]:
        """The step directories under ``root``, in (job, attempt, step) order."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for entry in root.iterdir():
                parts = entry.name.split(".")
                if entry.is_dir() and len(parts) == 3 and all(p.isdigit() for p in parts):
                    found.append(StepDir(root, (int(parts[0]), int(parts[1]), int(parts[2]))))
        return sorted(found, key=lambda d: d.key)

    def file(self, name: str) -> Path:
        """A file of the directory."""
        return self.path / name

    def spool(self, kind: str, task: int) -> Path:
        """A task's spool file: kind ``out`` or ``err``."""
        return self.path / f"{kind}.{task}"

    def spooled(self, spec: StepSpec) -> set[str]:
        """The names of the spool files the step's tasks write (``out.3``): not ``-o``/``-e`` files."""
        names = set()
        for task in spec.tasks:
            for kind, target in (("out", task.stdout), ("err", task.stderr)):
                if target is not None and target.path == str(self.spool(kind, task.task)):
                    names.add(f"{kind}.{task.task}")
        return names

    def create(self) -> None:
        """Make the directory (private: the environment of the tasks is in it)."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)

    def _write(self, name: str, data: bytes, mode: int = 0o600) -> None:
        tmp = self.path / f"{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        tmp.replace(self.path / name)

    def _read(self, name: str, kind: type[_T]) -> _T | None:
        try:
            return msgspec.json.decode((self.path / name).read_bytes(), type=kind)
        except (OSError, msgspec.DecodeError):
            return None

    def write_spec(self, spec: StepSpec) -> None:
        """``step.spec``, 0600: marshalled, the one format the supervisor reads without importing a module."""
        self._write(stepd.SPEC_FILE, marshal.dumps(msgspec.to_builtins(spec)))

    def spec(self) -> StepSpec | None:
        """``step.spec``, if written."""
        try:
            return msgspec.convert(marshal.loads((self.path / stepd.SPEC_FILE).read_bytes()), StepSpec)
        except (OSError, ValueError, EOFError, TypeError, msgspec.ValidationError):
            return None

    def pids(self) -> StepPids | None:
        """``pids``, once the supervisor wrote it."""
        return self._read(stepd.PIDS_FILE, StepPids)

    def exit_of(self, task: int, node: str) -> TaskExit | None:
        """A task's exit, once the supervisor wrote it."""
        found = self._read(f"{stepd.EXIT_PREFIX}{task}", _Exit)
        if found is None:
            return None
        return TaskExit(
            task=task,
            node=node,
            exit_code=found.exit_code,
            signal=found.signal,
            error=found.error,
            pid=found.pid,
            started_at=found.started_at,
            ended_at=found.ended_at,
        )

    def tail_state(self) -> TailState:
        """``tail.json`` (empty before the first write)."""
        return self._read("tail.json", TailState) or TailState()

    def write_tail_state(self, state: TailState) -> None:
        """``tail.json``, by rename."""
        self._write("tail.json", msgspec.json.encode(state))

    def write_coord(self, record: CoordRecord) -> None:
        """``coord.json``, 0600."""
        self._write("coord.json", msgspec.json.encode(record))

    def coord(self) -> CoordRecord | None:
        """``coord.json``, if this node coordinates the step."""
        return self._read("coord.json", CoordRecord)

    def mark(self, name: str) -> None:
        """Leave a marker file (``killing``, ``coord.started``, ``coord.exited``)."""
        with contextlib.suppress(OSError):
            (self.path / name).touch()

    def marked(self, name: str) -> bool:
        """Whether a marker file is there."""
        return (self.path / name).exists()

    def remove(self) -> None:
        """Forget the step here."""
        shutil.rmtree(self.path, ignore_errors=True)


def running(pid_ticks: tuple[int, int]) -> bool:
    """The recorded process (pid, start ticks) still runs."""
    return procstat.is_running(*pid_ticks)
