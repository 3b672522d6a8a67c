"""A step's output on this node: the spool files tailed to srun, each task's exit published after its
output, srun's stdin fed to task 0, and the step let go once every exit is out.

The agent follows a step through its directory (``stepdir.py``): it tails the spool files (stdout/stderr
when there are no ``-o/-e`` files) to srun on ``corral.io.<user>.<key>.{out,err}.<task>``, then publishes
each exit on ``.exit.<task>``; srun's stdin arrives for task 0 on ``corral.io.<user>.<key>.in`` (an empty
message is end of file) and goes down a pipe this agent process holds. How far the output got is saved only
after a NATS flush, so a restart may repeat a little output, never lose any.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg

from corral.libs.runtime import nats_link
from corral.schemas.steps import TaskExit, io_subject
from corral.services.agent import holes, stepdir
from corral.services.agent.background import Background
from corral.services.agent.step_cgroups import StepCgroup, StepCgroups
from corral.services.agent.step_state import COORD_EXITED, COORD_FILE, LocalStep, StepTable, vanished
from corral.services.agent.stepdir import TailState
from corral.services.agent.supervisor import Supervisor

#: Published spool bytes of a file whose disk space is freed at once (see ``_reclaim``).
RECLAIM_BYTES = 1 << 20
#: Seconds a peer keeps the exits of a step whose tasks have all ended (for the coordinator's poll).
KEEP_S = 60.0
#: Seconds between looks at a step's spool and exit files (output latency; exits also wake it at once).
TAIL_S = 0.02
#: Seconds between saves of how far the output was published, while it flows.
SAVE_S = 0.25
_CHUNK = 1 << 16
#: Seconds a round trip to NATS may take after publishing output (nats-py's flush default).
FLUSH_TIMEOUT_S = 10


class StepOutput:
    """Forwards this node's steps' output and exits to srun, and srun's stdin to task 0."""

    def __init__(
        self, nc: Client, node: str, table: StepTable, cgroups: StepCgroups, background: Background
    ) -> None:
        self.nc = nc
        self.node = node
        self.table = table  # the node's steps (a coordinated step notes this node's exits directly)
        self.cgroups = cgroups  # the memory cgroups the steps' tasks joined
        self.background = background  # where the step's leftovers (a cgroup's removal) run

    async def follow(self, local: LocalStep) -> None:
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
                alive = local.stepd_alive()
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
        close_stdin(local)
        if local.stdin_sub is not None:
            with contextlib.suppress(Exception):
                await local.stdin_sub.unsubscribe()
        if local.proc is not None:
            await local.proc.wait(5)  # it exits right after the last exit
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
        return [vanished(task, self.node) for task in lost]

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
                subject = io_subject(local.user, local.key, kind, task, self.node)
                while chunk := fh.read(_CHUNK):
                    with contextlib.suppress(Exception):
                        await self.nc.publish(subject, chunk)
                    local.offsets[name] = local.offsets.get(name, 0) + len(chunk)
                    published = True
        return published

    async def _flush(self) -> None:
        # nats_link.flush, not nc.flush: a timed-out nc.flush ends the connection's read loop (nats-py).
        await nats_link.flush(self.nc, FLUSH_TIMEOUT_S)

    @staticmethod
    def _save(local: LocalStep) -> None:
        with contextlib.suppress(OSError):
            local.dir.write_tail_state(TailState(offsets=local.offsets, reported=sorted(local.exits)))

    async def feed(self, local: LocalStep, msg: Msg) -> None:
        """Write srun's stdin to task 0 (an empty message closes it)."""
        fd = local.stdin_fd
        if fd is None:
            return
        if not msg.data:
            close_stdin(local)
            return
        data = msg.data
        while data and local.stdin_fd == fd:
            try:
                data = data[os.write(fd, data) :]
            except BlockingIOError:
                await asyncio.sleep(0.01)  # the task reads slowly: the pipe is full
            except OSError:
                close_stdin(local)  # it closed its stdin, or ended
                return

    async def _publish_exit(self, local: LocalStep, exit: TaskExit) -> None:
        local.exits[exit.task] = exit
        coordinated = self.table.coordinated.get(local.step)
        if coordinated is not None:
            coordinated.note_exit(exit)  # this node coordinates the step: no round trip
        with contextlib.suppress(Exception):
            await self.nc.publish(
                io_subject(local.user, local.key, "exit", exit.task, self.node), msgspec.json.encode(exit)
            )

    def _release_local(self, local: LocalStep) -> None:
        """This node's part is over. A peer keeps the exits a while for the coordinator's poll, then forgets
        the step; the coordinator forgets it once its end is recorded (see ``StepCoord``). A peer's run
        cgroup goes with the run's last step here."""
        cgroup, local.cgroup = local.cgroup, StepCgroup(None, False)
        self.background.spawn(self.cgroups.release(local.step[:2], cgroup))
        if local.dir.marked(COORD_EXITED):
            self.table.forget(local)
        elif not local.dir.file(COORD_FILE).exists():
            asyncio.get_running_loop().call_later(KEEP_S, self.table.forget, local)


async def listen(local: LocalStep, reader: asyncio.StreamReader, proc: Supervisor) -> None:
    """Wake the follower whenever the supervisor says a task ended (until it exits or we stop)."""
    try:
        while await reader.readline():
            local.wake.set()
    finally:
        proc.close_stdout()
        local.wake.set()


def close_stdin(local: LocalStep) -> None:
    """Close the write end of task 0's stdin, if this agent process holds it (the task sees end of file)."""
    if local.stdin_fd is not None:
        with contextlib.suppress(OSError):
            os.close(local.stdin_fd)
        local.stdin_fd = None


def _reclaim(local: LocalStep) -> None:
    """Free the disk space of what was published and saved of each spool file, a MiB or more at a time
    (``holes.py``): a long, chatty step keeps only its unpublished output on the node's disk."""
    for name, offset in local.offsets.items():
        if offset - local.punched.get(name, 0) >= RECLAIM_BYTES and holes.punch(local.dir.file(name), offset):
            local.punched[name] = offset
