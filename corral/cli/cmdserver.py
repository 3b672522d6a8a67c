"""The command server: a user's Slurm commands run in a fork of a process that has loaded them already.

Why: submitit and dask start ``sbatch``, ``squeue`` and ``sacct`` by the thousand, and most of such a
command's wall time is Python loading msgspec, the schemas and the command's own modules (~50 ms of ~80 ms
here), not the request to the cluster (a few ms). So the first command a user runs starts a server in the
background, one per user and installation, that loads every served command once; each later command is a thin
client that hands the server its argv, environment, working directory, umask and standard streams, and the
server forks a child that runs the command as that process would have. ``bench/RESULTS.md`` has the numbers.

One exchange, over a Unix socket in a directory only the user can enter::

    client -> server   request: protocol, identity, command, argv, environment, umask, mount namespace, how
                       its streams are encoded; with its fds 0, 1, 2 and its working directory (SCM_RIGHTS)
    server             accepts, checks the peer is the same user, forks; the child does the rest
    child -> client    ("started", pid)    or ("refused", reason): the client runs the command itself
    client -> child    "go"                (without it the child ends without running anything)
    child -> client    ("exit", status)    after the command ran and its streams were flushed

Nothing is lost or run twice: until "go" the command has not started, and the client runs it itself on any
failure up to there (no server, a stale one, a wrong identity, a timeout); after "go" only the child runs it.
Ctrl-C and the other terminating signals the client gets are forwarded to the child.

Not served: commands inside a job (``SLURM_JOB_ID`` set: the server would live in the job's cgroup and count
against its memory), srun and salloc (long-lived and interactive), and any process whose fds 0-2 are not all
open. ``CORRAL_CMD_SERVER=off`` turns serving off; ``=require`` makes a command fail when it cannot be served
(for tests and benchmarks). A server exits after ``CORRAL_CMD_SERVER_IDLE`` seconds without a request (600),
and as soon as a module it loaded changes on disk (an upgrade, or an edit of an editable install): the
request that noticed is refused and the next command starts a new server.

What a served command sees differently from a process of its own: its parent process, session and process
group (the server's), its resource limits and cgroup (the server's, started by the user's first command
outside a job). The Slurm commands read none of these.

This module is imported by every command process (``launch``): only builtins and small C modules at the top.
"""

from __future__ import annotations

# _socket is the C module under socket: socket.py costs a command ~5 ms to load (see libs/nats_request.py)
import _socket
import marshal
import os
import sys
from collections.abc import Mapping

TYPE_CHECKING = False  # not typing's: a served command's process must not load typing (~5 ms)
if TYPE_CHECKING:
    from typing import IO, NoReturn

#: Version of the exchange above; a server refuses another.
PROTOCOL = 1
#: Seconds a client waits for the server to answer before running the command itself.
HANDSHAKE_TIMEOUT = 2.0
#: Seconds a child waits for "go": long, since a client that sent it no longer runs the command itself.
GO_TIMEOUT = 60.0
#: Seconds a server waits for a request before it exits.
DEFAULT_IDLE = 600.0
#: The signals a client forwards to the child running its command.
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
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
_MAX_FRAME = 64 << 20  # a request carries the environment, which is small; anything this big is not ours
_FDS = 4  # stdin, stdout, stderr, working directory


class NotServed(Exception):
    """The command could not be handed to a server; the caller runs it itself."""


# --- where the server listens -------------------------------------------------------------------------------


def runtime_dir(environ: Mapping[str, str]) -> str:
    """The user's private directory for servers: ``$XDG_RUNTIME_DIR/corral`` or ``/tmp/corral-<uid>``."""
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "corral")
    return f"/tmp/corral-{os.getuid()}"


def private_dir(path: str) -> str:
    """Create ``path`` (0700) if missing; OSError unless it is a real directory of this user that no one else
    can enter (someone else's directory or a link there would let them answer our commands)."""
    os.makedirs(path, 0o700, exist_ok=True)
    info = os.lstat(path)
    if not (info.st_mode & 0o170000 == 0o040000 and info.st_uid == os.getuid() and info.st_mode & 0o077 == 0):
        raise PermissionError(f"{path} is not a directory of user {os.getuid()} with mode 0700")
    return path


def identity(environ: Mapping[str, str]) -> str:
    """What a server must share with its clients: the interpreter, this installation and the module path."""
    return "\0".join((sys.executable, sys.version, __file__, environ.get("PYTHONPATH", "")))


def socket_path(directory: str, ident: str) -> str:
    """The socket of the server for ``ident`` in ``directory``."""
    import binascii

    return os.path.join(directory, f"cmd-{binascii.crc32(ident.encode()):08x}.sock")


# --- framing ------------------------------------------------------------------------------------------------


def _frame(value: object) -> bytes:
    payload = marshal.dumps(value)  # type: ignore[arg-type]  # tuples of str, int, list and dict only
    return len(payload).to_bytes(4, "big") + payload


def _recv_exact(sock: _socket.socket, size: int, head: bytes = b"") -> bytes:
    data = bytearray(head)
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        data += chunk
    return bytes(data)


def _recv_frame(sock: _socket.socket, head: bytes = b"") -> object:
    header = _recv_exact(sock, 4, head[:4])
    size = int.from_bytes(header, "big")
    if size > _MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return marshal.loads(_recv_exact(sock, size, head[4:]))


def _peer_uid(sock: _socket.socket) -> int:
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder)


def _mount_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return 0


# --- the client ---------------------------------------------------------------------------------------------


def served(command: str) -> int | None:
    """Run ``command`` (argv in ``sys.argv``) through the user's server; its exit status, or None when it was
    not served and the caller must run it itself (a server is then started for the next command)."""
    mode = os.environ.get("CORRAL_CMD_SERVER", "on").lower()
    if mode in ("off", "0", "no") or "SLURM_JOB_ID" in os.environ:
        return None
    try:
        return _call(command)
    except KeyboardInterrupt:
        return 130  # Ctrl-C before "go": nothing ran, as a command interrupted at its start
    except NotServed as exc:
        if mode == "require":
            print(f"{command}: error: not served by a command server: {exc}", file=sys.stderr)
            return 1
        return None


def _call(command: str) -> int:
    environ = os.environ
    ident = identity(environ)
    try:
        path = socket_path(private_dir(runtime_dir(environ)), ident)
    except OSError as exc:
        raise NotServed(str(exc)) from None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as exc:
            start_server(path, ident)
            raise NotServed(f"no server at {path} ({exc.strerror}); starting one") from None
        pid = _handshake(sock, command, ident)
        sock.settimeout(None)
        return _wait(sock, command, pid)
    finally:
        sock.close()


def _handshake(sock: _socket.socket, command: str, ident: str) -> int:
    """Send the request; the pid of the child that waits for "go"."""
    streams = []
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if stream is None:
            raise NotServed("a standard stream is closed")
        streams.append(
            (
                stream.encoding,
                stream.errors,
                getattr(stream, "line_buffering", False),
                getattr(stream, "write_through", False),
            )
        )
    umask = os.umask(0o022)
    os.umask(umask)
    request = (
        PROTOCOL,
        ident,
        command,
        list(sys.argv),
        dict(os.environ),
        umask,
        _mount_namespace(),
        streams,
    )
    try:
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        raise NotServed(f"cannot open the working directory: {exc.strerror}") from None
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)
        if _peer_uid(sock) != os.getuid():
            raise NotServed("the server runs as another user")
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, cwd))
        data = _frame(request)
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        sock.sendall(data[sent:])
        answer = _recv_frame(sock)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise NotServed(f"unexpected answer {answer!r}")
        if answer[0] != "started" or not isinstance(answer[1], int):
            raise NotServed(f"refused: {answer[1]}")
        return answer[1]
    except (OSError, EOFError, ValueError, TypeError) as exc:
        raise NotServed(f"the server did not answer ({exc})") from None
    finally:
        os.close(cwd)


def _wait(sock: _socket.socket, command: str, pid: int) -> int:
    """Tell the child to go and wait for its exit status, forwarding the terminating signals we get to it
    (from before "go": a Ctrl-C can no longer stop this process while the child runs on)."""
    import signal

    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return  # it has just ended

    previous = {}
    for name in FORWARDED:
        signum = getattr(signal, name)
        previous[signum] = signal.signal(signum, forward)
    try:
        try:
            sock.sendall(_frame("go"))
        except OSError as exc:
            raise NotServed(f"the server went away ({exc})") from None  # the child has not run anything
        answer = _recv_frame(sock)
    except (OSError, EOFError, ValueError):
        answer = None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if isinstance(answer, tuple) and len(answer) == 2 and answer[0] == "exit":
        return int(answer[1])
    if forwarded:
        # the child died of the signal we passed on: die of it too, as the command would have
        signum = forwarded[-1]
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return 128 + signum
    print(
        f"{command}: error: the command ended without an exit status (its server died)",
        file=sys.stderr,
    )
    return 1


def start_server(path: str, ident: str) -> None:
    """Start a server for ``path`` in the background, detached from this process and its streams."""
    import contextlib
    import subprocess

    with contextlib.suppress(OSError, ValueError):  # the command runs by itself all the same
        subprocess.Popen(
            # -P: no working directory on sys.path, where a module could shadow ours
            [sys.executable, "-P", "-m", "corral.cli.cmdserver", path, ident.encode().hex()],
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )


def stop_servers(directory: str) -> list[int]:
    """SIGTERM every server whose lock file is in ``directory``; their pids (for tests and benchmarks)."""
    import signal

    stopped = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        if not name.endswith(".lock"):
            continue
        try:
            with open(os.path.join(directory, name)) as fh:
                pid = int(fh.read().strip() or 0)
            if pid > 0:
                os.kill(pid, signal.SIGTERM)
                stopped.append(pid)
        except (OSError, ValueError):
            continue
    return stopped


# --- the server ---------------------------------------------------------------------------------------------


class _Server:
    """What the server loaded and what it must stay equal to."""

    def __init__(self, path: str, ident: str) -> None:
        self.path = path
        self.ident = ident
        self.mount_namespace = _mount_namespace()
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
    """Run a server on ``path`` until it has been idle for ``idle`` seconds, is stopped or goes stale."""
    import contextlib
    import fcntl
    import gc
    import select
    import signal
    import socket

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
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a crashed server's socket (we hold the lock, so no live server owns it)
        listener.bind(path)
        os.chmod(path, 0o600)
        bound = os.stat(path).st_ino
        listener.listen(128)
        while True:
            readable, _, _ = select.select([listener], [], [], idle)
            if not readable:
                return 0
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                if _peer_uid(conn) != os.getuid():
                    continue
                if os.fork() == 0:
                    _in_child(listener, lock, conn, server)
            except OSError:
                continue
            finally:
                conn.close()
    finally:
        listener.close()
        try:
            if bound is not None and os.stat(path).st_ino == bound:
                os.unlink(path)
        except OSError:
            pass


def _in_child(listener: _socket.socket, lock: IO[str], conn: _socket.socket, server: _Server) -> NoReturn:
    """The forked child's life: never back into the server's loop (whose cleanup would remove its socket)."""
    status = 1
    try:
        listener.close()
        lock.close()  # a child outliving the server must not keep the next one from starting
        status = _child(conn, server)
    except BaseException:  # reported, and the child ends all the same
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # stderr may be gone
            pass
    finally:
        os._exit(status)


def _child(conn: _socket.socket, server: _Server) -> int:
    """In the forked child: take the request, become the client's command and run it; the child's status."""
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until the command runs
    fds: list[int] = []
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        data, ancillary, _, _ = conn.recvmsg(1 << 16, _socket.CMSG_SPACE(4 * _FDS))
        for level, kind, payload in ancillary:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds += [int.from_bytes(payload[i : i + 4], sys.byteorder) for i in range(0, len(payload), 4)]
        if not data:
            return 1
        request = _recv_frame(conn, data)
        refusal = server.refusal(request)
        if refusal is None and len(fds) != _FDS:
            refusal = f"{len(fds)} file descriptors instead of {_FDS}"
        if refusal is not None:
            conn.sendall(_frame(("refused", refusal)))
            if refusal.endswith(("changed", "is gone")):
                os.kill(os.getppid(), signal.SIGTERM)  # stale: let the next command start a fresh server
            return 0
        conn.sendall(_frame(("started", os.getpid())))
        conn.settimeout(GO_TIMEOUT)
        if _recv_frame(conn) != "go":
            return 0
    except (OSError, EOFError, ValueError, TypeError):
        return 1
    assert isinstance(request, tuple)
    _, _, command, argv, environ, umask, _, streams = request
    _become(fds, argv, environ, umask, streams)
    status = _run(command)
    try:
        conn.settimeout(HANDSHAKE_TIMEOUT)
        conn.sendall(_frame(("exit", status)))
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
    import signal
    import time

    stdin, stdout, stderr, cwd = fds
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
        os.close(fd)
    os.fchdir(cwd)
    os.close(cwd)
    os.umask(umask)
    os.environ.clear()
    os.environ.update(environ)
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
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _run(command: str) -> int:
    """Run the command's ``main`` as its own process would: its status, with exit and flush semantics kept."""
    from corral.cli import launch

    try:
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
