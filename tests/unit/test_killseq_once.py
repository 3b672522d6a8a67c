"""The kill sequence signals each process once: the batch shell is both in its process group and in the
job's cgroup, and a second SIGTERM that arrives after bash ran its trap for the first runs the trap again
(seen in CI as ``batch TERM`` logged twice, 6 ms apart)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.services.agent import killseq


@pytest.fixture
def two_sessions() -> Iterator[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    """Two real processes, each the leader of its own process group."""
    a = subprocess.Popen(["sleep", "30"], start_new_session=True)
    b = subprocess.Popen(["sleep", "30"], start_new_session=True)
    yield a, b
    for p in (a, b):
        p.kill()
        p.wait()


def test_a_member_of_a_signalled_group_is_not_signalled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, two_sessions: tuple[subprocess.Popen[bytes], ...]
) -> None:
    a, b = two_sessions
    sent: list[tuple[str, int, int]] = []
    real_kill, real_killpg = killseq.os.kill, killseq.os.killpg

    def kill(pid: int, sig: int) -> None:
        sent.append(("pid", pid, sig))
        real_kill(pid, sig)

    def killpg(pgid: int, sig: int) -> None:
        sent.append(("group", pgid, sig))
        real_killpg(pgid, sig)

    monkeypatch.setattr(killseq.os, "kill", kill)
    monkeypatch.setattr(killseq.os, "killpg", killpg)
    # Group a is signalled as a group; the cgroup holds a (again) and b (in no signalled group).
    seq = killseq.KillSequence(str(tmp_path), groups=lambda: [a.pid], members=lambda: [a.pid, b.pid])
    seq.send(signal.SIGCONT)
    assert sent == [("group", a.pid, signal.SIGCONT), ("pid", b.pid, signal.SIGCONT)]
