"""The command server's client and protocol: a user's Slurm commands run in a fork of a process that
has loaded them already (the server: ``cmdserver.py``).
Why: submitit and dask start ``sbatch``, ``squeue`` and ``sacct`` by the thousand, and most of such a
command's wall time is Python loading msgspec, the schemas and the command's own modules (~50 ms of ~80 ms
here), not the request to the cluster (a few ms). So the first command a user runs starts a server in the
background, one per user and installation, that loads every served command once; each later command is a thin
client that hands the server its argv, environment, working directory, umask and standard streams, and a
child the server forked ahead (``cmdchild.py``) runs the command as that process would have.
``bench/RESULTS.md`` has the numbers.

One exchange, over a Unix socket in a directory only the user can enter::

    client -> server   request: protocol, identity, command, argv, environment, umask, mount namespace, how
                       its streams are encoded; with its fds 0, 1, 2 and its working directory (SCM_RIGHTS)
    server's child     accepts (forked before), checks the peer is the same user, and does the rest
    child -> client    ("started", pid)    or ("refused", reason): the client runs the command itself
    client -> child    "go"                (without it the child ends without running anything)
    child -> client    ("exit", status)    after the command ran and its streams were flushed and closed

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

This module is imported by every command process (``launch``): only builtins and small C modules at the top,
and nothing of the server's side.
"""

# No "from __future__ import annotations" (the __future__ module is one more to load): the annotations that
# name a module loaded only for the type checker are quoted.
# _socket is the C module under socket: socket.py costs a command ~5 ms to load (libs/runtime/nats_request.py)
import _socket
import marshal
import os
import sys

# typing.TYPE_CHECKING without typing, and collections.abc only for the type checker: each costs a command's
# process a module or more to load
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import NoReturn

#: Version of the exchange above; a server refuses another.
PROTOCOL = 1
#: Seconds a client waits for the server to answer before running the command itself.
HANDSHAKE_TIMEOUT = 2.0
#: The signals a client forwards to the child running its command.
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
_MAX_FRAME = 64 << 20  # a request carries the environment, which is small; anything this big is not ours
FDS = 4  # stdin, stdout, stderr, working directory


class NotServed(Exception):
    """The command could not be handed to a server; the caller runs it itself."""


# --- where the server listens -------------------------------------------------------------------------------


def runtime_dir(environ: "Mapping[str, str]") -> str:
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


def identity(environ: "Mapping[str, str]") -> str:
    """What a server must share with its clients: the interpreter, this installation and the module path.
    The installation is this file's real path: an editable install reaches it through ``src/corral``, a
    symbolic link, and a process started in the checkout through ``corral``; both are the same code."""
    here = os.path.realpath(__file__)
    return "\0".join((sys.executable, sys.version, here, environ.get("PYTHONPATH", "")))


def socket_path(directory: str, ident: str) -> str:
    """The socket of the server for ``ident`` in ``directory``, named by a 32-bit FNV-1a hash of ``ident``
    (binascii's crc32 would cost a command a shared library to load)."""
    digest = 0x811C9DC5
    for byte in ident.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return os.path.join(directory, f"cmd-{digest:08x}.sock")


# --- framing ------------------------------------------------------------------------------------------------


def frame(value: object) -> bytes:
    payload = marshal.dumps(value)  # type: ignore[arg-type]  # tuples of str, int, list and dict only
    return len(payload).to_bytes(4, "big") + payload


def recv_exact(sock: _socket.socket, size: int, head: bytes = b"") -> bytes:
    data = bytearray(head)
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the connection")
        data += chunk
    return bytes(data)


def recv_frame(sock: _socket.socket, head: bytes = b"") -> object:
    header = recv_exact(sock, 4, head[:4])
    size = int.from_bytes(header, "big")
    if size > _MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    return marshal.loads(recv_exact(sock, size, head[4:]))


def peer_uid(sock: _socket.socket) -> int:
    creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    return int.from_bytes(creds[4:8], sys.byteorder)


def mount_namespace() -> int:
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


def leave(status: int) -> "NoReturn":
    """End this process with the served command's status: its streams flushed, without the interpreter's
    teardown (nothing of the command ran here; the child flushed its own output)."""
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 (contextlib is a module more to load)
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed, or None
            pass
    os._exit(status & 0xFF)


def _call(command: str) -> int:
    environ = os.environ
    ident = identity(environ)
    try:
        path = socket_path(private_dir(runtime_dir(environ)), ident)
    except OSError as exc:
        raise NotServed(str(exc)) from None
    # all made before connecting, so that the request follows the connection at once: the child that takes the
    # connection finds it there instead of waiting (one wake-up less on a busy machine)
    data = frame(_request(command, ident))
    try:
        cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)
    except OSError as exc:
        raise NotServed(f"cannot open the working directory: {exc.strerror}") from None
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(HANDSHAKE_TIMEOUT)
        try:
            sock.connect(path)
        except OSError as exc:
            start_server(path, ident)
            raise NotServed(f"no server at {path} ({exc.strerror}); starting one") from None
        pid = _handshake(sock, data, cwd)
        os.close(cwd)
        cwd = -1
        sock.settimeout(None)
        return _wait(sock, command, pid)
    finally:
        sock.close()
        if cwd >= 0:
            os.close(cwd)


def _request(command: str, ident: str) -> tuple[object, ...]:
    """The request for ``command``: this process's argv, environment, umask and how its streams encode."""
    streams = []
    for fd, stream in enumerate((sys.stdin, sys.stdout, sys.stderr)):
        try:
            os.fstat(fd)
        except OSError:
            stream = None
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
    return (
        PROTOCOL,
        ident,
        command,
        list(sys.argv),
        dict(os.environ),
        umask,
        mount_namespace(),
        streams,
    )


def _handshake(sock: _socket.socket, data: bytes, cwd: int) -> int:
    """Send the request with fds 0-2 and ``cwd``; the pid of the child that waits for "go"."""
    try:
        if peer_uid(sock) != os.getuid():
            raise NotServed("the server runs as another user")
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, cwd))
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        sock.sendall(data[sent:])
        answer = recv_frame(sock)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise NotServed(f"unexpected answer {answer!r}")
        if answer[0] != "started" or not isinstance(answer[1], int):
            raise NotServed(f"refused: {answer[1]}")
        return answer[1]
    except (OSError, EOFError, ValueError, TypeError) as exc:
        raise NotServed(f"the server did not answer ({exc})") from None


def _wait(sock: _socket.socket, command: str, pid: int) -> int:
    """Tell the child to go and wait for its exit status, forwarding the terminating signals we get to it
    (from before "go": a Ctrl-C can no longer stop this process while the child runs on)."""
    # _signal, the C module under signal (no stub): signal.py builds its enums with enum (~2-4 ms here)
    import _signal  # type: ignore[import-not-found]

    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return  # it has just ended

    previous = {}
    for name in FORWARDED:
        signum = getattr(_signal, name)
        previous[signum] = _signal.signal(signum, forward)
    try:
        try:
            sock.sendall(frame("go"))
        except OSError as exc:
            raise NotServed(f"the server went away ({exc})") from None  # the child has not run anything
        answer = recv_frame(sock)
    except (OSError, EOFError, ValueError):
        answer = None
    finally:
        for signum, handler in previous.items():
            _signal.signal(signum, handler)
    if isinstance(answer, tuple) and len(answer) == 2 and answer[0] == "exit":
        return int(answer[1])
    if forwarded:
        # the child died of the signal we passed on: die of it too, as the command would have
        signum = forwarded[-1]
        _signal.signal(signum, _signal.SIG_DFL)
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


def live_servers(directory: str) -> list[int]:
    """The pids of the servers running in ``directory``: those whose lock file is locked (a lock file outlives
    its server, and the pid in it may belong to another process by now)."""
    import fcntl

    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    pids = []
    for name in names:
        if not name.endswith(".lock"):
            continue
        try:
            with open(os.path.join(directory, name)) as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    pids.append(int(fh.read().strip() or 0))  # held: its server runs
        except (OSError, ValueError):
            continue
    return [pid for pid in pids if pid > 0]


def stop_servers(directory: str) -> list[int]:
    """SIGTERM every server running in ``directory``; their pids (for tests, the bench and the demo)."""
    import signal

    stopped = []
    for pid in live_servers(directory):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        stopped.append(pid)
    return stopped
