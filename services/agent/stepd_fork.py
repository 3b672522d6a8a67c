"""The supervisors' fork server: one interpreter with ``stepd.py`` loaded, forking a supervisor per step.

A supervisor started as a new interpreter (``python -I -S stepd.py``) costs its node ~10 ms of CPU before it
does anything (the interpreter's start, then loading ``stepd.py`` and the modules it loads by path); with
trivial jobs that is a fifth of all the CPU a job costs the whole cluster (``bench/RESULTS.md``). The agent
starts this server once, detached in its own session like a supervisor and as stdlib-only, and asks it for
each supervisor over a Unix socket; the server forks, and the child becomes exactly what
``python -I -S stepd.py STEP_DIR [STDIN_FD]`` would be: its own session, the step directory as its working
directory, ``/dev/null`` as stdin, the agent's pipe as stdout (the handshake and ``exit <task>`` lines),
the step's log as stderr; then ``stepd.main``. One mechanism per step still: the same supervisor code,
handshake, kill sequence and adoption rule (``docs/decisions/agent.md``, "Supervisor fork server").

Protocol (a ``SOCK_SEQPACKET`` socket on fd 0, one request at a time): the agent sends a marshalled
``[step_dir, has_stdin]`` with the descriptors ``[stdout, stderr]`` (and task 0's stdin, if it has one) as
``SCM_RIGHTS``; the server answers a marshalled ``[pid]`` with a pidfd of the child (the agent waits for
the supervisor's end on it, since it is not the agent's child), or ``[0, why]``.

The server is each supervisor's parent and reaps them as they end (PID 1 may not: a VM's init here leaves
orphans as zombies). When the agent's end of the socket closes (the agent stopped or died), it takes no
more requests and exits once its last supervisor has ended; a restarted agent starts a server of its own.

Usage: ``python -I -S stepd_fork.py`` with the socket as fd 0.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half, without enum
import _socket  # socket's C half, without enum and selectors
import array
import contextlib
import marshal
import os
import select
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Bytes of a request's payload (a step directory's path and a flag), at most.
REQUEST_BYTES = 8192
#: Descriptors a request carries, at most (stdout, stderr, stdin).
MAX_FDS = 3
#: The listening end: fd 0, given by the agent.
SOCKET_FD = 0


#: The modules ``stepd.main`` loads by path (``stepd.load_lib``), loaded here once for every child.
STEPD_LIBS = ("procstat", "sigreset", "taskstart", "killseq", "memcg")


def load_stepd() -> object:
    """``stepd.py`` from beside this file (``-I`` puts no package on the path) and the modules it loads:
    loaded once, for every child."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.append(here)
    stepd = __import__("stepd")
    for name in STEPD_LIBS:
        stepd.load_lib(name)
    return stepd


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors of a message's ``SCM_RIGHTS`` parts."""
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return list(fds)


def become_supervisor(stepd: object, step_dir: str, fds: list[int], keep: list[int]) -> None:
    """In the forked child: become the step's supervisor and never return. ``fds``: stdout, stderr and
    optionally task 0's stdin; ``keep``: the server's own descriptors, closed here."""
    code = 1
    try:
        _signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # stepd waits for its tasks itself
        os.setsid()
        os.chdir(step_dir)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)  # (fd 0 was the server's socket)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in {null, fds[0], fds[1], *keep} - {0, 1, 2}:
            os.close(fd)
        argv = [step_dir, *(str(fd) for fd in fds[2:])]
        code = stepd.main(argv)  # type: ignore[attr-defined]
    except BaseException as exc:  # whatever it is, the child must not return into the server's loop
        with contextlib.suppress(OSError):
            os.write(2, f"supervisor: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def serve() -> int:
    """Fork a supervisor per request until the agent's end closes, then outlive the last supervisor."""
    stepd = load_stepd()
    sock: Any = _socket.socket(fileno=SOCKET_FD)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)  # a handler, so the wake-up fd is written
    _signal.set_wakeup_fd(wake_w)
    children = 0
    open_ = True
    while open_ or children:
        try:
            ready = select.select([sock, wake_r] if open_ else [wake_r], [], [], None if open_ else 1.0)[0]
        except InterruptedError:
            continue
        if wake_r in ready or not open_:  # a child ended (or, closing, a second passed): reap
            with contextlib.suppress(BlockingIOError, InterruptedError):
                while os.read(wake_r, 512):
                    pass
            while children:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    children = 0
                    break
                if pid == 0:
                    break
                children -= 1
        if open_ and sock in ready:
            try:
                payload, ancillary, _, _ = sock.recvmsg(
                    REQUEST_BYTES, _socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
                )
            except InterruptedError:
                continue
            except OSError:
                payload, ancillary = b"", []
            fds = received_fds(ancillary)
            if not payload:
                open_ = False  # the agent is gone: no more requests
                for fd in fds:
                    os.close(fd)
                continue
            children += answer(sock, stepd, payload, fds, [SOCKET_FD, wake_r, wake_w])
    return 0


def answer(sock: object, stepd: object, payload: bytes, fds: list[int], keep: list[int]) -> int:
    """Fork the supervisor a request asks for and answer with its pid and pidfd; how many children it made."""
    made = 0
    reply: list[object]
    pidfd = -1
    try:
        step_dir, has_stdin = marshal.loads(payload)
        if len(fds) != 2 + bool(has_stdin):
            raise ValueError(f"{len(fds)} descriptors for a request with stdin={has_stdin}")
        pid = os.fork()
        if pid == 0:
            become_supervisor(stepd, step_dir, fds, keep)
        made = 1
        # Opened before any reaping (this loop reaps, and only after it answered): the pid is still ours.
        pidfd = os.pidfd_open(pid)
        reply = [pid]
    except (OSError, ValueError, TypeError, EOFError) as exc:
        reply = [0, f"{type(exc).__name__}: {exc}"]
    finally:
        for fd in fds:
            os.close(fd)
    rights = (
        [] if pidfd < 0 else [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", [pidfd]).tobytes())]
    )
    try:
        sock.sendmsg([marshal.dumps(reply)], rights)  # type: ignore[attr-defined]
    except OSError:
        pass  # the agent is gone; the next receive says so
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return made


if __name__ == "__main__":
    sys.exit(serve())
