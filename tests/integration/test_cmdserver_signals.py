"""The command server's exchange driven by hand, to place a signal where a real client can only race to.

A client installs its signal forwarder before it sends "go" (``cmdclient._wait``), so a Ctrl-C may reach the
child before "go" or before the command has its handler. The child must then stop the command at its start,
not ignore the signal and run on (seen in CI: a served ``sbatch`` waiting on its stdin after a Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cli import cmdclient


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real server of this installation in a private directory: its socket and identity."""
    directory = tmp_path / "runtime"
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
        yield path, ident
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _started(path: str, ident: str, stdin: int, out: int) -> tuple[socket.socket, int]:
    """Hand the server ``sbatch`` with no script (it reads stdin); the connection and the waiting child."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(15)
    sock.connect(path)
    streams = [("utf-8", "strict", False, False)] * 3
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    request = (
        cmdclient.PROTOCOL,
        ident,
        "sbatch",
        ["sbatch"],
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


@pytest.mark.parametrize("when", ["before go", "just after go"])
def test_a_ctrl_c_the_child_gets_at_its_start_stops_the_command(
    server: tuple[str, str], tmp_path: Path, when: str
) -> None:
    read, write = os.pipe()  # sbatch's stdin: held open, so only the signal can end it
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        sock, child = _started(*server, read, out)
        with sock:
            if when == "before go":
                os.kill(child, signal.SIGINT)
                sock.sendall(cmdclient.frame("go"))
            else:
                sock.sendall(cmdclient.frame("go"))
                os.kill(child, signal.SIGINT)
            try:
                answer = cmdclient.recv_frame(sock)
            except TimeoutError:
                os.kill(child, signal.SIGKILL)
                pytest.fail("the child ignored the Ctrl-C and ran on")
        assert answer == ("exit", 130)
    finally:
        os.close(read)
        os.close(write)
        os.close(out)
