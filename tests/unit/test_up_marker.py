"""``up.pid``: a command that finds its local cluster stopped or its runner gone says so at once."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from corral.cli import up_marker
from corral.cli.client import ClusterDown, find_cluster


def test_a_running_cluster_is_not_down_and_a_stopped_one_is(tmp_path: Path) -> None:
    assert not up_marker.is_down(tmp_path)  # no file: an older cluster, retried as before
    up_marker.mark_up(tmp_path)
    assert not up_marker.is_down(tmp_path)
    up_marker.mark_stopped(tmp_path)
    assert up_marker.is_down(tmp_path)


def test_a_cluster_whose_runner_was_killed_is_down(tmp_path: Path) -> None:
    runner = subprocess.Popen(
        [sys.executable, "-c", f"from corral.cli import up_marker; up_marker.mark_up({str(tmp_path)!r})"]
    )
    assert runner.wait(timeout=30) == 0
    assert (tmp_path / up_marker.UP_FILE).read_text().split()[0] == str(runner.pid)
    assert up_marker.is_down(tmp_path)


def test_an_unreadable_marker_is_not_taken_for_down(tmp_path: Path) -> None:
    (tmp_path / up_marker.UP_FILE).write_text("garbage\n")
    assert not up_marker.is_down(tmp_path)


def test_a_command_fails_at_once_against_a_stopped_local_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    user = "alice"
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / f"{user}.json").write_text(
        json.dumps({"user": user, "password": "x", "url": f"nats://127.0.0.1:{port}"})
    )
    monkeypatch.setattr("getpass.getuser", lambda: user)
    cluster = find_cluster({"CORRAL_STATE_DIR": str(tmp_path)})
    assert cluster.local_state == str(tmp_path)
    up_marker.mark_stopped(tmp_path)
    began = time.monotonic()
    with pytest.raises(ClusterDown, match="is not running; start it with 'corral up'"):
        cluster.request("corral.api.v1.alice.status", b"{}")
    assert time.monotonic() - began < 2.0
    # Credentials named explicitly belong to no local state directory: retried as before.
    named = find_cluster({"CORRAL_CREDENTIALS": str(creds / f"{user}.json")})
    assert named.local_state is None
