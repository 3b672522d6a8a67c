"""Starting a step's supervisor (``stepd.py``), and what the agent process that started it sees of it.

A supervisor is forked by the node's supervisor fork server (``stepd_fork.py``), which the agent starts once
and starts again if it is gone; where the server cannot answer (it died, it is stuck, it could not fork),
the supervisor is started as a new interpreter, as every supervisor was before the server (the same
program either way: ``python -I -S stepd.py STEP_DIR [STDIN_FD]``). The agent sees either kind the same
way: its pid, its stdout (the handshake ``ok`` and each ``exit <task>``) and its end, through a pidfd (a
forked supervisor is the server's child, not the agent's). What outlives the agent process is on disk
(the step directory's ``pids``, exit and status files), as before: a restarted agent adopts either kind
by its recorded pid and start ticks.

Failure: a server that dies takes no supervisor with it (each has its own session and goes on; the
orphans' parent is then PID 1). A launch whose request fails starts its supervisor as a new interpreter,
and the next launch starts a new server.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import structlog

from corral.services.agent import stepd, stepd_fork

#: Seconds the fork server may take to answer a request before the launch starts a new interpreter.
FORK_ANSWER_S = 10.0


class Supervisor:
    """A supervisor this agent process started: its pid, its stdout and its end."""

    def __init__(self, pid: int, pidfd: int, stdout: int, popen: subprocess.Popen[bytes] | None) -> None:
        self.pid = pid
        self._pidfd = pidfd  # readable once the process has ended
        self._stdout = stdout  # read end of its stdout (handed to ``reader`` on first use)
        self._popen = popen  # set when it is this process's own child (started as a new interpreter)
        self._ended = asyncio.Event()
        self._reader: asyncio.StreamReader | None = None
        self._transport: Any = None
        asyncio.get_running_loop().add_reader(pidfd, self._on_end)

    def _on_end(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        if self._popen is not None:
            self._popen.poll()  # reap our own child
        self._ended.set()

    async def reader(self) -> asyncio.StreamReader:
        """Its stdout, as lines: the handshake (``ok`` or ``error ...``), then ``exit <task>`` per task."""
        if self._reader is None:
            self._reader = asyncio.StreamReader()
            loop = asyncio.get_running_loop()
            self._transport, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(self._reader),  # type: ignore[arg-type]
                os.fdopen(self._stdout, "rb", buffering=0),
            )
        return self._reader

    def close_stdout(self) -> None:
        """Stop reading its stdout (it still runs; a supervisor whose reader is gone ignores that)."""
        if self._transport is not None:
            self._transport.close()
        elif self._stdout >= 0:
            os.close(self._stdout)
        self._stdout = -1

    def alive(self) -> bool:
        """Whether it still runs (not ended, whether or not reaped yet)."""
        if self._ended.is_set():
            return False
        return not select.select([self._pidfd], [], [], 0)[0]

    async def wait(self, timeout: float | None = None) -> bool:
        """Until it has ended (True), or ``timeout`` seconds passed (False)."""
        try:
            await asyncio.wait_for(self._ended.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL it (through its pidfd: never another process that took its pid)."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)


class Supervisors:
    """Starts the node's supervisors: forked by the fork server, else as new interpreters."""

    def __init__(self, directory: Path, log: Any = None, fork: bool = True) -> None:
        self.directory = directory  # the fork server's working directory, with its log
        self.log = log or structlog.get_logger()
        self.fork = fork  # False: every supervisor a new interpreter (the server is not used)
        self._server: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    @property
    def server_pid(self) -> int | None:
        """The fork server's pid, while this agent process uses one."""
        return self._server.pid if self._server is not None and self._sock is not None else None

    async def start(self, step_dir: Path, stderr: int, stdin: int | None, env: dict[str, str]) -> Supervisor:
        """Start the supervisor of ``step_dir`` (its working directory) with ``stderr`` (its log) and task 0's
        ``stdin``, if any (the caller closes its own copies), and return it. ``env``: the environment of a
        supervisor started as a new interpreter (a forked one has the server's, which is empty but for
        ``PATH``; a supervisor uses neither). OSError: it could not be started either way."""
        r, w = os.pipe()
        os.set_inheritable(r, False)
        try:
            fds = [w, stderr, *([stdin] if stdin is not None else [])]
            forked = await self._forked(step_dir, fds) if self.fork else None
            if forked is not None:
                return Supervisor(*forked, r, None)
            popen = self._spawn(step_dir, w, stderr, stdin, env)
            return Supervisor(popen.pid, os.pidfd_open(popen.pid), r, popen)
        except BaseException:
            os.close(r)
            raise
        finally:
            os.close(w)

    def _spawn(
        self, step_dir: Path, stdout: int, stderr: int, stdin: int | None, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        # Its own session: it outlives the agent, and no signal to the agent's group reaches it.
        # (subprocess, not asyncio's: an asyncio subprocess transport kills its child when closed.)
        argv = [sys.executable, "-I", "-S", stepd.__file__, str(step_dir)]
        return subprocess.Popen(
            [*argv, *([str(stdin)] if stdin is not None else [])],
            cwd=step_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            pass_fds=() if stdin is None else (stdin,),
        )

    async def _forked(self, step_dir: Path, fds: list[int]) -> tuple[int, int] | None:
        """(pid, pidfd) of a supervisor the fork server forked with ``fds``; None if it could not (the
        server is then dropped: the next launch starts a new one)."""
        async with self._lock:  # one request at a time: an answer is the last request's
            try:
                sock = self._server_socket()
                sock.sendmsg(
                    [marshal.dumps([str(step_dir), len(fds) > 2])],
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())],
                )
                payload, pidfd = await asyncio.wait_for(self._answer(sock), FORK_ANSWER_S)
                answer = marshal.loads(payload)
            except (OSError, TimeoutError, ValueError, EOFError, TypeError) as exc:
                self.log.warning("supervisor fork server failed: a new interpreter instead", error=str(exc))
                self._drop()
                return None
            except BaseException:
                # Cancelled with the request out: its answer would be read as the next request's. The
                # server forks it all the same, and ends once its supervisors have.
                self._drop()
                raise
        if not answer or not answer[0] or pidfd is None:
            if pidfd is not None:
                os.close(pidfd)
            why = answer[1] if len(answer) > 1 else "no answer"
            self.log.warning("supervisor fork server could not fork: a new interpreter instead", error=why)
            return None
        return int(answer[0]), pidfd

    async def _answer(self, sock: socket.socket) -> tuple[bytes, int | None]:
        loop = asyncio.get_running_loop()
        while True:
            try:
                payload, ancillary, _, _ = sock.recvmsg(
                    stepd_fork.REQUEST_BYTES, socket.CMSG_SPACE(array.array("i").itemsize)
                )
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_reader(sock.fileno(), ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_reader(sock.fileno())
                continue
            if not payload:
                raise EOFError("the fork server closed its socket")
            fds = stepd_fork.received_fds(ancillary)
            for extra in fds[1:]:
                os.close(extra)
            if fds:
                os.set_inheritable(fds[0], False)  # (received without close-on-exec)
            return payload, fds[0] if fds else None

    def _server_socket(self) -> socket.socket:
        """The socket to a running fork server, started now if there is none."""
        if self._sock is not None and self._server is not None and self._server.poll() is None:
            return self._sock
        self._drop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = os.open(self.directory / "stepd_fork.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            # Detached like a supervisor (its own session, stdlib-only, -I -S): it outlives this process
            # until its last supervisor ended.
            self._server = subprocess.Popen(
                [sys.executable, "-I", "-S", stepd_fork.__file__],
                cwd=self.directory,
                env={"PATH": os.defpath},
                stdin=theirs.fileno(),
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            theirs.close()
            os.close(log)
        ours.setblocking(False)
        self._sock = ours
        # Reaped here whenever it ends (its pidfd turns readable): the Popen is kept until then.
        pidfd = os.pidfd_open(self._server.pid)
        asyncio.get_running_loop().add_reader(pidfd, self._reap, self._server, pidfd)
        self.log.info("supervisor fork server started", pid=self._server.pid)
        return ours

    @staticmethod
    def _reap(server: subprocess.Popen[bytes], pidfd: int) -> None:
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)
        server.poll()

    def _drop(self) -> None:
        """Let the fork server go: it takes no more requests and ends after its last supervisor."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._server = None  # (reaped once it ended: ``_reap``)

    def close(self) -> None:
        """This agent process stops: the server ends after its last supervisor (which go on)."""
        self._drop()
