"""The command server (``cmdclient.py`` has the why and the exchange): one per user and installation, it loads
every served command once, then forks a child per request that becomes the client's command and runs it.

``python -m corral.cli.cmdserver SOCKET IDENTITY-IN-HEX`` is what the client's ``start_server`` runs. It
exits after ``CORRAL_CMD_SERVER_IDLE`` seconds without a request (600), on SIGTERM, and once a module it
loaded changed on disk.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import IO, NoReturn

from corral.cli.cmdclient import (
    FDS,
    HANDSHAKE_TIMEOUT,
    PROTOCOL,
    frame,
    mount_namespace,
    peer_uid,
    private_dir,
    recv_frame,
)

#: Seconds a child waits for "go": long, since a client that sent it no longer runs the command itself.
GO_TIMEOUT = 60.0
#: Seconds a server waits for a request before it exits.
DEFAULT_IDLE = 600.0
#: Seconds at most between a spare taking a command and the next spare's fork (sooner when the command ends or
#: another client waits).
NEXT_SPARE_S = 0.05
#: Modules a server loads besides the served commands: what they import inside functions.
PRELOAD = (
    "corral.cli.client",
    "corral.cli.sacct_json",
    "corral.cli.sbatch_args",
    "corral.cli.scontrol_nodes",
    "corral.cli.scontrol_resv",
    "grp",
    "pwd",
)


class _Server:
    """What the server loaded and what it must stay equal to."""

    def __init__(self, path: str, ident: str) -> None:
        self.path = path
        self.ident = ident
        self.mount_namespace = mount_namespace()
        self.watched: list[tuple[str, int, int]] = []

    def load(self) -> None:
        """Load every served command and what it imports later, and note the files they came from."""
        import importlib

        from corral.cli import launch

        for command in launch.SERVED:
            launch.load(command)
        for name in PRELOAD:
            importlib.import_module(name)
        files = {sys.executable}
        for name, module in list(sys.modules.items()):
            origin = getattr(module, "__file__", None)
            if origin and (name.startswith("corral") or name.startswith("msgspec")):
                files.add(origin)
        for origin in sorted(files):
            info = os.stat(origin)
            self.watched.append((origin, info.st_mtime_ns, info.st_size))

    def stale(self) -> str | None:
        """The first loaded file that changed or went away since the server loaded it."""
        for origin, mtime, size in self.watched:
            try:
                info = os.stat(origin)
            except OSError:
                return f"{origin} is gone"
            if (info.st_mtime_ns, info.st_size) != (mtime, size):
                return f"{origin} changed"
        return None

    def refusal(self, request: object) -> str | None:
        """Why this server cannot run ``request``, or None."""
        if not (isinstance(request, tuple) and len(request) == 8 and request[0] == PROTOCOL):
            return "another protocol"
        if request[1] != self.ident:
            return "another installation"
        if request[6] != self.mount_namespace:
            return "another mount namespace"
        return self.stale()


def serve(path: str, ident: str, idle: float) -> int:
    """Run a server on ``path`` until it has been idle for ``idle`` seconds, is stopped or goes stale.

    The server itself accepts no connection: one child forked ahead (the spare) waits for the next command,
    so that neither the fork nor the child's setup is on the command's way. A spare that takes a connection
    tells the server, which forks the next one when that command has ended, or at once when another client
    waits (within ``NEXT_SPARE_S`` in any case); a command that comes meanwhile waits in the listen queue.
    Each spare holds the read end of a pipe whose only writer is the server, so it ends with the server
    however that ends (its socket then refuses or is gone: clients run their commands by themselves).
    """
    import fcntl
    import gc
    import select
    import signal
    import time

    private_dir(os.path.dirname(path))
    lock = open(path.removesuffix(".sock") + ".lock", "a+")  # noqa: SIM115 (held for the server's life)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another server for this installation is starting or running
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n")
    lock.flush()
    server = _Server(path, ident)
    server.load()
    gc.collect()
    gc.freeze()  # the children share the loaded modules' pages instead of touching them

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound = None
    alive = os.pipe()  # the server holds the write end alone: EOF in a spare means the server is gone
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a crashed server's socket (we hold the lock, so no live server owns it)
        listener.bind(path)
        os.chmod(path, 0o600)
        bound = os.stat(path).st_ino
        listener.listen(128)
        listener.setblocking(False)  # the spare waits in select, which also watches for the server's end
        while True:
            # the spare writes a byte when it took a connection, and holds the pipe until it ends
            taken, tell = os.pipe()
            try:
                if os.fork() == 0:
                    os.close(taken)
                    _in_spare(_Spare(listener, lock, alive, tell, os.getppid()), server)
            finally:
                os.close(tell)
            try:
                ready, _, _ = select.select([taken], [], [], idle)
                if not ready:
                    return 0  # idle: the spare ends with the server
                if os.read(taken, 1):
                    # the next spare once this command ended, or another client waits, or after a while: a
                    # fork at once would take a CPU from the command that has just started
                    select.select([taken, listener.fileno()], [], [], NEXT_SPARE_S)
                else:
                    time.sleep(0.1)  # it ended without a command (killed): no fork loop if that repeats
            finally:
                os.close(taken)
    finally:
        listener.close()
        try:
            if bound is not None and os.stat(path).st_ino == bound:
                os.unlink(path)
        except OSError:
            pass


class _Spare:
    """What a spare child holds of the server's: to close, or to wait on."""

    def __init__(
        self, listener: socket.socket, lock: IO[str], alive: tuple[int, int], tell: int, server_pid: int
    ) -> None:
        self.listener = listener
        self.lock = lock
        self.alive = alive
        self.tell = tell
        self.server_pid = server_pid


def _in_spare(spare: _Spare, server: _Server) -> NoReturn:
    """A spare child's life: never back into the server's loop (whose cleanup would remove its socket)."""
    status = 1
    try:
        spare.lock.close()  # a child outliving the server must not keep the next one from starting
        os.close(spare.alive[1])
        _prepare_child()
        conn = _accept(spare)
        if conn is None:
            status = 0
        else:
            os.write(spare.tell, b".")  # and it stays open until this process ends (see serve)
            status = _child(conn, server, spare.server_pid)
    except BaseException:  # reported, and the child ends all the same
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # stderr may be gone
            pass
    finally:
        os._exit(status)


def _prepare_child() -> None:
    """A child's signals: the defaults again, with Ctrl-C held until its command runs.

    Held, not ignored: a Ctrl-C the client forwards before "go" or before the command's handler is in place
    then stops the command at its start (it was lost, and the command ran on).
    """
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _accept(spare: _Spare) -> socket.socket | None:
    """The next connection of this user (closing the listener then), or None once the server is gone."""
    import select

    while True:
        ready, _, _ = select.select([spare.listener.fileno(), spare.alive[0]], [], [])
        if spare.alive[0] in ready:
            return None
        try:
            conn, _ = spare.listener.accept()
        except (BlockingIOError, InterruptedError):
            continue
        if peer_uid(conn) == os.getuid():
            spare.listener.close()
            os.close(spare.alive[0])
            return conn
        conn.close()


def _child(conn: socket.socket, server: _Server, server_pid: int) -> int:
    """In the spare that took ``conn``: take the request, become the client's command, run it; its status."""
    import signal

    fds: list[int] = []
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        data, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(4 * FDS))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, len(payload), 4)]
        if not data:
            return 1
        request = recv_frame(conn, data)
        refusal = server.refusal(request)
        if refusal is None and len(fds) != FDS:
            refusal = f"{len(fds)} file descriptors instead of {FDS}"
        if refusal is not None:
            conn.sendall(frame(("refused", refusal)))
            if refusal.endswith(("changed", "is gone")) and os.getppid() == server_pid:
                os.kill(server_pid, signal.SIGTERM)  # stale: let the next command start a fresh server
            return 0
        conn.sendall(frame(("started", os.getpid())))
        assert isinstance(request, tuple)
        _, _, command, argv, environ, umask, _, streams = request
        # while "go" travels: becoming the client's process touches nothing but this one (its fds, directory,
        # umask, environment); without "go" it ends all the same, having run nothing and read nothing
        _become(fds, argv, environ, umask, streams)
        conn.settimeout(GO_TIMEOUT)
        if recv_frame(conn) != "go":
            return 0
    except (OSError, EOFError, ValueError, TypeError):
        return 1
    status = _run(command)
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        conn.sendall(frame(("exit", status)))
    except OSError:
        pass
    return status


def _become(
    fds: list[int],
    argv: list[str],
    environ: dict[str, str],
    umask: int,
    streams: list[tuple[str, str, bool, bool]],
) -> None:
    """Take the client's streams, directory, umask, environment and argv."""
    import io
    import time

    stdin, stdout, stderr, cwd = fds
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
        os.close(fd)
    os.fchdir(cwd)
    os.close(cwd)
    os.umask(umask)
    # the client's environment: what differs from the server's only (the server started with a client's)
    for key in [key for key in os.environ if key not in environ]:
        del os.environ[key]
    for key, value in environ.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    time.tzset()  # TZ is the client's now
    sys.argv = list(argv)
    made = []
    for fd, mode, (encoding, errors, line_buffering, write_through) in zip(
        (0, 1, 2), ("rb", "wb", "wb"), streams, strict=True
    ):
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedReader(raw) if mode == "rb" else io.BufferedWriter(raw)
        made.append(
            io.TextIOWrapper(
                buffered,
                encoding=encoding,
                errors=errors,
                line_buffering=line_buffering,
                write_through=write_through,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = made


def _run(command: str) -> int:
    """Run the command's ``main`` as its own process would: its status, with exit and flush semantics kept."""
    import signal

    from corral.cli import launch

    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a held Ctrl-C is raised here
        status = launch.load(command)()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        status = 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120  # as Python does when it cannot flush at exit
    # let go of the caller's streams before the status goes back: a caller reading the output to its end (a
    # pipe, as subprocess.run has it) waits for every copy, and the client exits as soon as it has the status
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    return int(status)


def main(argv: list[str] | None = None) -> int:
    """``python -m corral.cli.cmdserver SOCKET IDENTITY-IN-HEX``: what ``start_server`` runs."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m corral.cli.cmdserver SOCKET IDENTITY-IN-HEX", file=sys.stderr)
        return 2
    idle = float(os.environ.get("CORRAL_CMD_SERVER_IDLE") or DEFAULT_IDLE)
    return serve(args[0], bytes.fromhex(args[1]).decode(), idle)


if __name__ == "__main__":
    raise SystemExit(main())
