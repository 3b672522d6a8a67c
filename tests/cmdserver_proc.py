"""A real command server of this installation in a private directory, and the exchange driven by hand: for the
tests that place a signal or look at the server's processes where a real client only races to."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from corral.cli import cmdclient


@contextmanager
def running_server(directory: Path) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """Start a server in ``directory`` (made 0700); its socket, identity and process, stopped after."""
    directory.mkdir(mode=0o700)
    ident = cmdclient.identity(os.environ)
    path = cmdclient.socket_path(str(directory), ident)
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "corral.cli.cmdserver", path, ident.encode().hex()],
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(path):
            assert proc.poll() is None, "the server exited"
            assert time.monotonic() < deadline, "the server did not listen"
            time.sleep(0.02)
        yield path, ident, proc
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def holders(fd: int, pids: list[int]) -> list[int]:
    """Those of ``pids`` that hold the file (pipe, socket) open as ``fd`` is in this process."""
    target = os.readlink(f"/proc/self/fd/{fd}")
    found = []
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{name}") for name in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        if target in links:
            found.append(pid)
    return found


def hand_over(path: str, ident: str, argv: list[str], stdin: int, out: int) -> tuple[socket.socket, int]:
    """Send the server the request of ``argv`` as a client would; the connection and the waiting child."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(15)
    sock.connect(path)
    streams = [("utf-8", "strict", False, False)] * 3
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    request = (
        cmdclient.PROTOCOL,
        ident,
        argv[0],
        argv,
        env,
        0o022,
        cmdclient.mount_namespace(),
        streams,
    )
    cwd = os.open(".", os.O_PATH | os.O_DIRECTORY)
    try:
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (stdin, out, out, cwd))
        data = cmdclient.frame(request)
        sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        sock.sendall(data[sent:])
    finally:
        os.close(cwd)
    answer = cmdclient.recv_frame(sock)
    assert isinstance(answer, tuple) and answer[0] == "started", answer
    return sock, int(answer[1])
