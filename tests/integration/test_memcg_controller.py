"""Run cgroups on this machine's real memory controller: a process joins between fork and exec, the kernel
OOM-kills it at the limit, the count and the peak say so, and ``remove`` kills what is left and removes it.
Plus v2's controller delegation walk, on a directory tree laid out like cgroupfs (this machine's v2
hierarchy has no memory controller, so the real one cannot show it)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.services.agent import memcg

pytestmark = pytest.mark.integration

HOG = "b = b'x' * (200 << 20); print('survived')"


@pytest.fixture
def confinement() -> Iterator[memcg.Confinement]:
    """This machine's confinement under a root of the test's own (removed afterwards)."""
    found, why = memcg.probe(f"corral-test-{uuid.uuid4().hex[:8]}")
    if found is None:
        pytest.skip(f"no writable memory cgroup: {why}")
    yield found
    os.rmdir(found.root)


def run_in(cgroup: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run python ``code`` in ``cgroup`` (joined before exec, as the supervisor does)."""
    fd = memcg.open_procs(cgroup)
    try:
        return subprocess.run(
            [sys.executable, "-c", code],
            preexec_fn=functools.partial(memcg.join_self, fd),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.close(fd)


def test_over_the_limit_the_kernel_kills_and_the_count_tells(confinement: memcg.Confinement) -> None:
    cgroup = confinement.create("oom", memcg.limit_bytes(64))
    assert memcg.oom_count(cgroup) == 0
    done = run_in(cgroup, HOG)
    assert done.returncode == -9 and "survived" not in done.stdout
    assert memcg.oom_count(cgroup) == 1
    peak = memcg.peak_bytes(cgroup)
    assert peak is not None and peak <= 64 << 20
    assert memcg.remove(cgroup) and not os.path.exists(cgroup)


def test_within_the_limit_nothing_is_killed(confinement: memcg.Confinement) -> None:
    cgroup = confinement.create("fits", memcg.limit_bytes(400))
    done = run_in(cgroup, HOG)
    assert (done.returncode, done.stdout) == (0, "survived\n")
    assert memcg.oom_count(cgroup) == 0
    assert memcg.remove(cgroup)


def test_remove_kills_what_is_left(confinement: memcg.Confinement) -> None:
    cgroup = confinement.create("left", memcg.limit_bytes(100))
    # A process in its own session, as an escaped daemon would be.
    fd = memcg.open_procs(cgroup)
    sleeper = subprocess.Popen(
        ["sleep", "300"], start_new_session=True, preexec_fn=functools.partial(memcg.join_self, fd)
    )
    os.close(fd)
    assert memcg.members(cgroup) == [sleeper.pid]
    assert confinement.children("le") == [cgroup]
    assert memcg.remove(cgroup)
    assert sleeper.wait(timeout=10) == -9
    assert confinement.children("le") == []


def test_joining_a_removed_cgroup_fails_so_the_caller_can_start_unconfined(
    confinement: memcg.Confinement,
) -> None:
    cgroup = confinement.create("gone", memcg.limit_bytes(100))
    fd = memcg.open_procs(cgroup)
    try:
        assert memcg.remove(cgroup)
        with pytest.raises(subprocess.SubprocessError):
            subprocess.run(["true"], preexec_fn=functools.partial(memcg.join_self, fd), check=False)
    finally:
        os.close(fd)


def test_v2_delegates_the_memory_controller_down_to_the_root(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    # cgroupfs makes these files itself in a new directory; a plain directory needs them laid out first.
    for sub in ("site", "site/corral"):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "cgroup.subtree_control").write_text("")
    found, why = memcg.probe("site/corral", mounts_text=f"cgroup2 {tmp_path} cgroup2 rw,relatime 0 0\n")
    assert found == memcg.Confinement(memcg.V2, str(tmp_path / "site" / "corral"))
    assert why == f"cgroup v2 at {tmp_path}"
    for sub in ("", "site", "site/corral"):
        assert (tmp_path / sub / "cgroup.subtree_control").read_text() == "+memory", sub


def test_v2_without_the_memory_controller_is_not_used(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    found, why = memcg.probe("corral", mounts_text=f"cgroup2 {tmp_path} cgroup2 rw 0 0\n")
    assert (found, why) == (None, "no memory cgroup controller is mounted")
