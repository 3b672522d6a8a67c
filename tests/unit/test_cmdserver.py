"""The command server's pure parts: its directory, framing and refusals (the whole exchange: e2e)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from corral.cli import cmdclient, cmdserver


def test_the_runtime_directory_follows_xdg_or_falls_back_to_tmp() -> None:
    assert cmdclient.runtime_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == "/run/user/7/corral"
    assert cmdclient.runtime_dir({"XDG_RUNTIME_DIR": "relative"}) == f"/tmp/corral-{os.getuid()}"
    assert cmdclient.runtime_dir({}) == f"/tmp/corral-{os.getuid()}"


def test_a_private_directory_is_made_0700_and_anything_else_refused(tmp_path: Path) -> None:
    made = cmdclient.private_dir(str(tmp_path / "new"))
    assert os.stat(made).st_mode & 0o777 == 0o700
    assert cmdclient.private_dir(made) == made
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    loose.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(made)
    for bad in (loose, link):
        with pytest.raises(PermissionError, match="with mode 0700"):
            cmdclient.private_dir(str(bad))


def test_each_installation_has_its_own_socket() -> None:
    one = cmdclient.identity({"PYTHONPATH": ""})
    other = cmdclient.identity({"PYTHONPATH": "/elsewhere"})
    assert cmdclient.socket_path("/d", one) == cmdclient.socket_path("/d", one)
    assert cmdclient.socket_path("/d", one) != cmdclient.socket_path("/d", other)


def test_frames_survive_being_split_across_reads() -> None:
    value = (1, "ident", ["squeue", "-a"], {"A": "b" * 100_000})
    data = cmdclient.frame(value)
    for received in (0, 3, 7):  # what the first read got: nothing, part of the length, part of the payload
        left, right = socket.socketpair()
        with left, right:
            left.sendall(data[received:])
            assert cmdclient.recv_frame(right, data[:received]) == value
    left, right = socket.socketpair()
    with left, right:
        left.close()
        with pytest.raises(EOFError):
            cmdclient.recv_frame(right)


def test_a_server_refuses_other_protocols_installations_namespaces_and_changed_files(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text("x = 1\n")
    server = cmdserver._Server(str(tmp_path / "s.sock"), "ident")
    info = module.stat()
    server.watched = [(str(module), info.st_mtime_ns, info.st_size)]

    def request(protocol: int = cmdclient.PROTOCOL, ident: str = "ident", ns: int | None = None) -> tuple:
        namespace = server.mount_namespace if ns is None else ns
        return (protocol, ident, "squeue", ["squeue"], {}, 0o022, namespace, [])

    assert server.refusal(request()) is None
    assert server.refusal(request(protocol=0)) == "another protocol"
    assert server.refusal(("not", "a", "request")) == "another protocol"
    assert server.refusal(request(ident="other")) == "another installation"
    assert server.refusal(request(ns=server.mount_namespace + 1)) == "another mount namespace"
    module.write_text("x = 22\n")
    assert server.refusal(request()) == f"{module} changed"
    module.unlink()
    assert server.refusal(request()) == f"{module} is gone"
