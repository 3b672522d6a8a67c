"""Running one batch script as a real process and supervising it to its end.

The script runs in its own session (process group) in the submit directory, with stdout/stderr
to its output files. A kill (cancel, requeue, time limit, preemption) is SIGCONT + SIGTERM to the whole
group, then SIGKILL after KillWait (after the grace time for a preemption that grants one).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from corral.schemas.api import LaunchOrder
from corral.services.agent.jobenv import job_environment, output_paths


class LaunchError(Exception):
    """The script could not be started; the message is for the user."""


@dataclass
class Outcome:
    """How a run ended."""

    exit_code: int  # exit status (0 if killed by a signal)
    signal: int  # terminating signal
    timed_out: bool  # killed at its time limit
    killed: bool  # killed on an order


class Run:
    """One running batch script."""

    def __init__(self, order: LaunchOrder, proc: asyncio.subprocess.Process, kill_wait: float) -> None:
        self.order = order
        self.proc = proc
        self.kill_wait = kill_wait
        self.timed_out = False
        self.killed = False
        self._killing: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        """Batch shell pid (= its process group id)."""
        return self.proc.pid

    def kill(self, *, timed_out: bool = False, grace_s: float | None = None) -> None:
        """Start the kill sequence once (later calls do nothing); ``grace_s`` replaces KillWait."""
        if self._killing is not None or self.proc.returncode is not None:
            return
        self.timed_out, self.killed = timed_out, not timed_out
        self._killing = asyncio.create_task(
            self._kill_sequence(self.kill_wait if grace_s is None else grace_s)
        )

    async def _kill_sequence(self, wait: float) -> None:
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)
        try:
            await asyncio.wait_for(self.proc.wait(), wait)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)

    async def wait(self) -> Outcome:
        """Supervise to the end, enforcing the time limit."""
        limit = self.order.time_limit_s
        try:
            if limit is None:
                await self.proc.wait()
            else:
                await asyncio.wait_for(asyncio.shield(self.proc.wait()), limit)
        except TimeoutError:
            self.kill(timed_out=True)
            await self.proc.wait()
        # Anything the script left behind in its process group goes with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        code = self.proc.returncode or 0
        return Outcome(
            exit_code=code if code >= 0 else 0,
            signal=-code if code < 0 else 0,
            timed_out=self.timed_out,
            killed=self.killed,
        )


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes of a process group (from /proc; Linux)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parentheses): state, ppid, pgrp, ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _open_output(path: str, append: bool) -> int:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    return os.open(path, flags, 0o644)


async def start(order: LaunchOrder, run_dir: Path, base_env: dict[str, str], kill_wait: float) -> Run:
    """Start the batch script; LaunchError says why it could not be."""
    spec = order.spec
    if not os.path.isdir(spec.workdir):
        raise LaunchError(f"cannot chdir to {spec.workdir}: no such directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "script"
    script.write_text(spec.script)
    script.chmod(0o700)
    stdout_path, stderr_path = output_paths(order)
    append = spec.open_mode == "append"
    try:
        out_fd = _open_output(stdout_path, append)
        err_fd = _open_output(stderr_path, append) if stderr_path else out_fd
    except OSError as exc:
        raise LaunchError(f"cannot open output file: {exc.strerror}: {exc.filename}") from None
    try:
        proc = await asyncio.create_subprocess_exec(
            str(script),
            *spec.argv,
            cwd=spec.workdir,
            env=job_environment(order, base_env, os.getuid()),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out_fd,
            stderr=err_fd,
            start_new_session=True,
        )
    except OSError as exc:
        raise LaunchError(f"cannot execute the batch script: {exc.strerror}") from None
    finally:
        os.close(out_fd)
        if err_fd != out_fd:
            os.close(err_fd)
    return Run(order, proc, kill_wait)
