"""A real PostgreSQL server from the pgserver wheel's binaries; as root it runs as an unprivileged user."""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import ClassVar
from urllib.parse import quote

from corral.libs.infra.managed import (
    UNIX_PATH_MAX,
    Account,
    InfraError,
    ManagedServer,
    ServerStartError,
    host_port,
    write_private,
)


class PostgresServer(ManagedServer):
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
        return f"postgresql://{self.USER}:{password}@{host_port(self.host, self.port)}/{self.DATABASE}"

    def _prepare(self) -> list[str]:
        if os.geteuid() == 0:
            self._account = _system_account(self.system_user)
        password_file = self.data_dir / "password"
        if not password_file.exists():
            write_private(password_file, secrets.token_urlsafe(32) + "\n")
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
        return len(os.fsencode(path)) < UNIX_PATH_MAX


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


def _system_account(name: str) -> Account:
    """Look up `name`, creating it as a system user without home or shell if it does not exist."""
    failure = ""
    for _ in range(5):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            pass
        else:
            return Account(name, entry.pw_uid, entry.pw_gid)
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
