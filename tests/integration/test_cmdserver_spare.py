"""The command server's spare child, and what a served command's own process loads (``cmdserver``).

A server keeps one child forked ahead, waiting for the next command, so that neither the fork nor the child's
setup is on a command's way; each spare ends with its server. The child lets go of the caller's streams before
it reports the exit status (a caller reading the command's output to its end waits for every copy of them),
and the command's own process loads only the client: no ``re`` (pip's console-script wrapper imports it),
no ``enum`` (``signal`` does), no ``collections``, neither msgspec nor typing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cmdserver_proc import children, hand_over, holders, running_server

from corral.cli import cmdclient

ROOT = Path(__file__).resolve().parents[2]
#: Modules a served command's own process must not load: each was measured costly (bench/RESULTS.md).
CLIENT_KEEPS_OUT = (
    "re",
    "enum",
    "signal",
    "collections",
    "binascii",
    "__future__",
    "typing",
    "msgspec",
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """A real server in ``tmp_path/corral``, where ``XDG_RUNTIME_DIR=tmp_path`` finds it."""
    with running_server(tmp_path / "corral") as running:
        yield running


def _spare(server: int, other_than: int = 0) -> int:
    """The server's waiting child (not ``other_than``)."""
    deadline = time.monotonic() + 15
    while not (spare := [pid for pid in children(server) if pid != other_than]):
        assert time.monotonic() < deadline, "the server has no child waiting"
        time.sleep(0.02)
    assert len(spare) == 1, spare
    return spare[0]


def test_a_command_is_handed_to_the_child_forked_before_it(
    server: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    path, ident, proc = server
    spare = _spare(proc.pid)
    null = os.open(os.devnull, os.O_RDWR)
    try:
        sock, child = hand_over(path, ident, ["sbatch", "--version"], null, null)
        with sock:
            assert child == spare
            assert _spare(proc.pid, other_than=child) != child  # the next one, while this one waits
            sock.sendall(cmdclient.frame("go"))
            assert cmdclient.recv_frame(sock) == ("exit", 0)
    finally:
        os.close(null)


def test_the_child_lets_go_of_the_callers_streams_before_the_exit_status(
    server: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    path, ident, _ = server
    read, write = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        sock, child = hand_over(path, ident, ["sbatch", "--version"], null, write)
        with sock:
            sock.sendall(cmdclient.frame("go"))
            assert cmdclient.recv_frame(sock) == ("exit", 0)
            assert holders(write, [child]) == []  # the caller's pipe ends with the client's copy alone
        os.close(write)
        write = -1
        with os.fdopen(read, "rb") as out:
            read = -1
            assert out.read().startswith(b"slurm ")
    finally:
        for fd in (read, write, null):
            if fd >= 0:
                os.close(fd)


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_the_spare_ends_with_its_server(
    server: tuple[str, str, subprocess.Popen[bytes]], sent: signal.Signals
) -> None:
    _, _, proc = server
    spare = _spare(proc.pid)
    proc.send_signal(sent)
    proc.wait(timeout=15)
    deadline = time.monotonic() + 15
    while Path(f"/proc/{spare}").exists() and _state(spare) != "Z":
        assert time.monotonic() < deadline, "the spare outlived its server"
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_a_served_commands_own_process_loads_the_client_alone(
    server: tuple[str, str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    direct = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "sbatch"), "--version"],
        env={**env, "CORRAL_CMD_SERVER": "off"},
        capture_output=True,
        text=True,
        check=True,
    )
    # -X importtime lists every module this process imports on its stderr (the child writes nothing there)
    served = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "bin" / "sbatch"), "--version"],
        env={**env, "CORRAL_CMD_SERVER": "require"},
        capture_output=True,
        text=True,
    )
    assert (served.returncode, served.stdout) == (0, direct.stdout), served.stderr
    loaded = {line.rsplit("|", 1)[1].strip() for line in served.stderr.splitlines() if "|" in line}
    assert "corral.cli.cmdclient" in loaded
    assert not any(name.startswith(("corral.schemas", "corral.libs")) for name in loaded)
    assert sorted(name for name in loaded if name.split(".")[0] in CLIENT_KEEPS_OUT) == []
