"""corral up's supervision: the backoff policy by numbers, and the supervisor over real processes that
die (a process started again with its command line; one that keeps crashing reported once with its log's
tail, the rest left running)."""

from __future__ import annotations

import getpass
import sys
from pathlib import Path

import pytest

from corral.cli.local_cluster import LocalCluster
from corral.cli.local_processes import Process
from corral.cli.supervision import BURST, Backoff, Supervisor

pytestmark = pytest.mark.unit


def test_the_delay_doubles_per_crash_and_resets_once_stable() -> None:
    b = Backoff(base_s=0.5, max_s=4.0, stable_s=60.0, burst=100, window_s=60.0)
    b.started(0.0)
    assert b.died(10.0) == 10.5  # first crash: the base delay
    b.started(10.5)
    assert b.died(11.0) == 12.0  # crashed soon after: 1 s
    b.started(12.0)
    assert b.died(12.5) == 14.5  # 2 s
    b.started(14.5)
    assert b.died(15.0) == 19.0  # 4 s, the longest
    b.started(19.0)
    assert b.died(20.0) == 24.0  # stays at the longest
    b.started(24.0)
    assert b.died(24.0 + 60.0) == 84.5  # up a minute: healthy again, the base delay


def test_a_burst_of_deaths_in_the_window_is_a_crash_loop_retried_at_the_longest_delay() -> None:
    b = Backoff(base_s=0.5, max_s=30.0, stable_s=60.0, burst=3, window_s=60.0)
    b.started(0.0)
    b.died(1.0)
    b.started(1.5)
    b.died(2.0)
    assert not b.looping()
    b.started(3.0)
    assert b.died(4.0) == 34.0 and b.looping()
    # Deaths older than the window no longer count.
    b.started(34.0)
    b.died(200.0)
    assert not b.looping()


def _cluster(tmp_path: Path, *programs: tuple[str, str]) -> LocalCluster:
    cluster = LocalCluster(tmp_path, getpass.getuser())
    (tmp_path / "logs").mkdir()
    for name, code in programs:
        argv = [sys.executable, "-c", code]
        cluster.processes.append(Process(name, argv, cluster._popen(name, argv)))
    return cluster


def test_a_dead_process_is_started_again_and_a_crash_loop_is_reported_once(tmp_path: Path) -> None:
    cluster = _cluster(
        tmp_path,
        ("steady", "import time; time.sleep(600)"),
        ("flaky", "import sys; print('flaky: cannot open its socket', flush=True); sys.exit(3)"),
    )
    try:
        supervisor = Supervisor(cluster, now=0.0)
        supervisor.watched[1].backoff = Backoff(base_s=0.0, max_s=0.0, burst=BURST)
        cluster.process("flaky").proc.wait()  # type: ignore[union-attr]
        steady = cluster.process("steady").proc
        out: list[str] = []
        now = 1.0
        for _ in range(BURST * 2):
            out += supervisor.tick(now)
            cluster.process("flaky").proc.wait()  # type: ignore[union-attr]
            out += supervisor.tick(now)
            now += 1.0
        text = "\n".join(out)
        assert "flaky exited with status 3; starting it again in 0 s" in text
        assert "flaky is running again" in text
        reports = [line for line in out if "keeps crashing" in line]
        assert len(reports) == 1, out  # once, not at every death
        assert "flaky: cannot open its socket" in reports[0]  # the tail of its log
        assert "missing now: flaky" in text
        assert cluster.process("steady").proc is steady and steady.poll() is None  # untouched
    finally:
        cluster.stop(kill_jobs=False)


def test_a_killed_process_comes_back_with_its_command_line(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, ("gateway", "import time; time.sleep(600)"))
    try:
        supervisor = Supervisor(cluster, now=0.0)
        first = cluster.process("gateway").proc
        assert first is not None
        first.kill()
        first.wait()
        assert supervisor.tick(10.0) == [
            "gateway was killed by signal 9; starting it again in 0.5 s",
            "missing now: gateway",
        ]
        assert supervisor.tick(10.2) == []  # not yet due
        assert supervisor.tick(10.6) == ["gateway is running again", "every process is running"]
        again = cluster.process("gateway").proc
        assert again is not None and again is not first and again.poll() is None
        assert again.args == first.args
        assert supervisor.tick(11.0) == []
    finally:
        cluster.stop(kill_jobs=False)
