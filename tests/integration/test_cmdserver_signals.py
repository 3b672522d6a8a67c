"""The command server's exchange driven by hand, to place a signal where a real client can only race to.

A client installs its signal forwarder before it sends "go" (``cmdclient._wait``), so a Ctrl-C may reach the
child before "go" or before the command has its handler. The child must then stop the command at its start,
not ignore the signal and run on (seen in CI: a served ``sbatch`` waiting on its stdin after a Ctrl-C).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from cmdserver_proc import hand_over, running_server

from corral.cli import cmdclient


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A real server of this installation in a private directory: its socket and identity."""
    with running_server(tmp_path / "runtime") as (path, ident, _):
        yield path, ident


@pytest.mark.parametrize("when", ["before go", "just after go"])
def test_a_ctrl_c_the_child_gets_at_its_start_stops_the_command(
    server: tuple[str, str], tmp_path: Path, when: str
) -> None:
    read, write = os.pipe()  # sbatch's stdin: held open, so only the signal can end it
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        sock, child = hand_over(*server, ["sbatch"], read, out)
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
