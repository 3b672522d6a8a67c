"""What a command server's child does with the request it took (``cmdclient.py`` has the exchange, and
``cmdserver.py`` the server): answer whether it runs it, become the client's process, run the command as that
process would have, and report its status.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Callable
from typing import IO

from corral.cli.cmdclient import FDS, HANDSHAKE_TIMEOUT, frame, recv_frame

#: Seconds a child waits for "go": long, since a client that sent it no longer runs the command itself.
GO_TIMEOUT = 60.0


def prepare() -> None:
    """Make a spare ready for a request: the signals' defaults again, with Ctrl-C held until its command runs,
    and the pages that becoming a command writes its own (``_warm``).

    Held, not ignored: a Ctrl-C the client forwards before "go" or before the command's handler is in place
    then stops the command at its start (it was lost, and the command ran on).
    """
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _warm()


def run_request(conn: socket.socket, refusals: Callable[[object], str | None], server_pid: int) -> int:
    """In the spare that took ``conn``: take the request (``refusals`` says why not), become the client's
    command and run it; the status this process ends with."""
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
        refusal = refusals(request)
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
    import time

    stdin, stdout, stderr, cwd = fds
    for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
        os.dup2(fd, target)
        os.close(fd)
    os.fchdir(cwd)
    os.close(cwd)
    os.umask(umask)
    _set_environment(environ)
    time.tzset()  # TZ is the client's now
    sys.argv = list(argv)
    sys.stdin, sys.stdout, sys.stderr = _text_streams((0, 1, 2), streams)


def _set_environment(environ: dict[str, str]) -> None:
    """Make this process's environment ``environ``, changing what differs only (the server started with a
    client's, so most of it is the same)."""
    for key in [key for key in os.environ if key not in environ]:
        del os.environ[key]
    for key, value in environ.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _text_streams(fds: tuple[int, int, int], streams: list[tuple[str, str, bool, bool]]) -> list[IO[str]]:
    """Text streams on ``fds`` (stdin, stdout, stderr), encoded as ``streams`` says, that leave them open."""
    import io

    made: list[IO[str]] = []
    for fd, mode, (encoding, errors, line_buffering, write_through) in zip(
        fds, ("rb", "wb", "wb"), streams, strict=True
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
    return made


def _warm() -> None:
    """Go once through what becoming a client's process goes through, changing nothing: a forked process
    shares its parent's memory until it first writes to a page, and a spare that has written these pages
    already does not copy them while a command waits (0.6 -> 0.3 ms here)."""
    import time

    _set_environment(dict(os.environ))
    time.tzset()
    null = os.open(os.devnull, os.O_RDWR)
    try:
        _text_streams((null, null, null), [(sys.getfilesystemencoding(), "strict", False, False)] * 3)
    finally:
        os.close(null)


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
