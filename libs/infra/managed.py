"""A server binary run as a child process in its own process group, with its state in one directory."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from corral.libs.infra.ports import free_port, port_is_free

POLL_SECONDS = 0.05
MIB = 1024 * 1024
# sizeof(sockaddr_un.sun_path) on Linux, including the terminating NUL.
UNIX_PATH_MAX = 108


class InfraError(Exception):
    """Root of the errors raised while launching or stopping embedded servers."""


class ServerStartError(InfraError):
    """A server exited during start-up or did not become ready in time."""

    def __init__(self, server: str, reason: str, log_tail: str) -> None:
        super().__init__(f"{server} did not start: {reason}\n--- last lines of its log ---\n{log_tail}")
        self.server = server
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class Account:
    """The unprivileged system account PostgreSQL runs as when we are root."""

    name: str
    uid: int
    gid: int


class ManagedServer:
    """A server binary run as a child process in its own process group, with state in `data_dir`.

    Subclasses say how to prepare the directory and build the command line (`_prepare`) and when the server
    is ready (`_is_ready`); this class picks the port, launches, waits and stops.
    """

    _name: ClassVar[str]
    _log_name: ClassVar[str]
    _stop_signal: ClassVar[signal.Signals]
    _stop_timeout: ClassVar[float]

    def __init__(self, data_dir: Path, port: int | None, host: str, ready_timeout: float) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.ready_timeout = ready_timeout
        self._requested_port = port
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._account: Account | None = None
        self._log_offset = 0

    @property
    def port(self) -> int:
        """The TCP port the server listens on; known once `start()` has chosen it."""
        if self._port is None:
            raise InfraError(f"{self._name} has not been started")
        return self._port

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        """The file that receives the server's stdout and stderr (appended across restarts)."""
        return self.data_dir / self._log_name

    def start(self) -> None:
        """Launch the server and return once it accepts connections; a no-op if it is already running."""
        if self.pid is not None:
            return
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._port = self._choose_port()
        argv = self._prepare()
        with self.log_path.open("ab") as log:
            self._log_offset = self.log_path.stat().st_size
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._workdir(),
                # Its own group: a Ctrl-C in our terminal does not reach it, and stop() can kill its children.
                process_group=0,
                user=self._account.uid if self._account else None,
                group=self._account.gid if self._account else None,
                # Without this the child would keep root's supplementary groups.
                extra_groups=[] if self._account else None,
            )
        try:
            self._wait_ready()
        except BaseException:
            self._kill()
            raise

    @property
    def name(self) -> str:
        """What the server is (``nats-server``, ``postgres``), for messages."""
        return self._name

    @property
    def returncode(self) -> int | None:
        """How the server's process ended (negative: the signal that killed it); None while it runs or
        before it started."""
        return None if self._proc is None else self._proc.poll()

    def revive(self) -> None:
        """Start the server again after it died, on the same port (its clients' credentials name it).

        What is left of its process group is killed and the dead server reaped first: a killed postmaster's
        backends would keep its shared memory, and an unreaped one its pid, which its lock file names."""
        if self.pid is not None:
            return
        if self._port is not None:
            self._requested_port = self._port
        self._kill()
        self.start()

    def stop(self) -> None:
        """Ask the server to shut down, wait for it, then kill its process group; idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(self._stop_signal)
            try:
                proc.wait(self._stop_timeout)
            except subprocess.TimeoutExpired:
                self._kill()
        proc.wait()
        self._proc = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _prepare(self) -> list[str]:
        """Make the data directory ready and return the server's command line."""
        raise NotImplementedError

    def _is_ready(self) -> bool:
        """Whether the server accepts connections now (called every poll while starting)."""
        raise NotImplementedError

    def _workdir(self) -> Path:
        """The directory the server process starts in."""
        return self.data_dir

    def _choose_port(self) -> int:
        port_file = self.data_dir / "port"
        stored = int(port_file.read_text()) if port_file.exists() else None
        if self._requested_port is not None:
            port = self._requested_port
        elif stored is not None and port_is_free(stored, self.host):
            port = stored
        else:
            port = free_port(self.host)
        if port != stored:
            write_private(port_file, f"{port}\n")
        return port

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while True:
            status = self._proc.poll()
            if status is not None:
                raise ServerStartError(self._name, f"exited with status {status}", self._log_tail())
            if self._is_ready():
                return
            if time.monotonic() > deadline:
                reason = f"not ready after {self.ready_timeout:g} s"
                raise ServerStartError(self._name, reason, self._log_tail())
            time.sleep(POLL_SECONDS)

    def _kill(self) -> None:
        """SIGKILL the whole process group (the server and any children) and reap the server."""
        if self._proc is None:
            return
        # The group leader is not reaped yet, so its pid (the group id) cannot have been reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._proc = None

    def _log_since_start(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self, lines: int = 25) -> str:
        return "\n".join(self._log_since_start().splitlines()[-lines:])

    def _accepts_tcp(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5):
                return True
        except OSError:
            return False


def write_private(path: Path, text: str) -> None:
    """Replace `path` atomically with `text`, readable by its owner only."""
    scratch = path.with_name(path.name + ".tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
    os.replace(scratch, path)


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
