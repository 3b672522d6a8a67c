"""``corral up`` in the foreground: SIGTERM stops everything cleanly; starting again keeps every job; it
prints where each process serves its metrics."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_cli import Cli, user_env

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent


def start_up(state: Path, env: dict[str, str], *flags: str) -> subprocess.Popen[str]:
    """Start ``corral up`` and wait for its ready line."""
    proc = subprocess.Popen(
        [str(BIN / "corral"), "up", "--state-dir", str(state), *flags],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "is up" in line:
            return proc
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"corral up did not start: {''.join(lines)}")


def stop_up(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then it must exit 0 by itself. If it does not within a minute it is killed (so that it does
    not outlive the test: its ResourceWarning failed the next test once); the error shows what it printed."""
    proc.send_signal(signal.SIGTERM)
    try:
        status = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        printed = proc.communicate(timeout=30)[0]
        stuck = f"corral up did not stop within 60 s of SIGTERM; it printed:\n{printed[-4000:]}"
        raise AssertionError(stuck) from None
    assert proc.stdout is not None
    proc.stdout.close()
    assert status == 0


def processes_using(state: Path) -> list[str]:
    """Command lines of live processes that mention the state directory or run inside it."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if str(state) in cmd or cwd.startswith(str(state)):
            found.append(cmd)
    return found


def test_up_stops_cleanly_and_keeps_every_job(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = user_env(state)
    cli = Cli(env=env, workdir=tmp_path)
    proc = start_up(state, env, "--nodes", "1", "--gpus-per-node", "2")
    try:
        # The metrics URLs: printed after the ready line, one per process, and written to metrics.json.
        assert proc.stdout is not None
        assert "Prometheus metrics" in proc.stdout.readline()
        urls = json.loads((state / "metrics.json").read_text())
        assert sorted(urls) == ["accounting", "agent-node1", "auth", "feed", "gateway", "health", "scheduler"]
        printed = dict(proc.stdout.readline().split() for _ in urls)
        assert printed == urls
        done = cli.sbatch("#!/bin/sh\necho done\n")
        cli.wait_state(done, ("COMPLETED",))
        # A job that cannot run yet (it needs both GPUs, another holds one) stays queued across the restart.
        holder = cli.sbatch("#!/bin/sh\n#SBATCH --gres=gpu:1\nsleep 600\n")
        cli.wait_state(holder, ("RUNNING",))
        queued = cli.sbatch("#!/bin/sh\n#SBATCH --gres=gpu:2\necho queued ran\n")
    finally:
        stop_up(proc)
    assert processes_using(state) == [], "processes left running after corral up stopped"
    # A command against the stopped cluster says so at once, instead of retrying for ten seconds.
    began = time.monotonic()
    down = cli("squeue")
    assert down.returncode != 0
    assert "is not running; start it with 'corral up'" in down.stderr, down.stderr
    assert time.monotonic() - began < 5.0
    creds = state / "credentials"
    for path in creds.rglob("*.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path

    proc = start_up(state, env)
    try:
        assert cli.sacct(done) == "COMPLETED|0:0"
        # The run killed by the shutdown is requeued, like a node failure; cancel it so the queued job runs.
        assert cli("scancel", str(holder)).returncode == 0
        assert cli.wait_state(holder, ("CANCELLED",)).startswith("CANCELLED")
        assert cli.wait_state(queued, ("COMPLETED",)) == "COMPLETED|0:0"
        assert (tmp_path / f"slurm-{queued}.out").read_text() == "queued ran\n"
        jobs = cli("squeue", "-h").stdout
        assert jobs == ""
        new = cli.sbatch("#!/bin/sh\ntrue\n")
        assert new > queued  # ids keep growing across restarts
    finally:
        stop_up(proc)
