"""Memory cgroups of runs: the v1/v2 files, detection from the mounts, names, limits, the cluster tag."""

from __future__ import annotations

import pytest
from test_jobenv import launch

from corral.libs.config.cluster import NodeConfig
from corral.services.agent import memcg
from corral.services.agent.confine import memory_limit_mb

pytestmark = pytest.mark.unit

MIB = 1024 * 1024

V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 2\noom_group_kill 0\n"


@pytest.mark.parametrize(
    ("text", "count"),
    [
        (V1_OOM_CONTROL, 3),
        (V2_EVENTS, 2),
        ("oom_kill_disable 0\nunder_oom 0\n", 0),
        ("low 0\nhigh 0\n", 0),
        ("oom_kill x\n", 0),
        ("", 0),
    ],
    ids=["v1-oom_control", "v2-memory.events", "v1-old-kernel", "v2-no-oom-line", "garbage", "empty"],
)
def test_oom_kill_count(text: str, count: int) -> None:
    assert memcg.oom_kills(text) == count


@pytest.mark.parametrize(
    ("text", "peak"),
    [("67108864\n", 64 * MIB), ("0\n", 0), ("max\n", None), ("", None)],
    ids=["bytes", "zero", "not-a-number", "empty"],
)
def test_peak_bytes(text: str, peak: int | None) -> None:
    assert memcg.parse_bytes(text) == peak


HYBRID = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
UNIFIED = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
NO_MEMORY_V1 = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n"


@pytest.mark.parametrize(
    ("mounts", "found"),
    [
        (HYBRID, ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified")),
        (UNIFIED, (None, "/sys/fs/cgroup")),
        (NO_MEMORY_V1, (None, None)),
        ("", (None, None)),
    ],
    ids=["hybrid", "unified", "v1-without-memory", "none"],
)
def test_memory_mounts(mounts: str, found: tuple[str | None, str | None]) -> None:
    assert memcg.memory_mounts(mounts) == found


def test_probe_without_any_memory_controller_says_why() -> None:
    confinement, why = memcg.probe("corral", mounts_text=NO_MEMORY_V1)
    assert confinement is None
    assert why == "no memory cgroup controller is mounted"


def test_run_names_carry_cluster_node_job_and_attempt() -> None:
    tag = memcg.cluster_tag("local", "/tmp/a/state/agents/node1")
    assert tag.startswith("local-") and len(tag) == len("local-") + 10
    assert memcg.run_name(tag, "node1", 42, 3) == f"{tag}_node1_42.3"


def test_cluster_tags_differ_between_state_directories() -> None:
    a = memcg.cluster_tag("local", "/tmp/a/state/agents/node1")
    b = memcg.cluster_tag("local", "/tmp/b/state/agents/node1")
    assert a != b
    assert a == memcg.cluster_tag("local", "/tmp/a/state/agents/node1/")


@pytest.mark.parametrize(
    ("mem_mb", "limit"),
    [(64, 64 * MIB), (1, memcg.MIN_RAM_SPACE_MB * MIB), (8192, 8 * 1024 * MIB)],
    ids=["as-allocated", "never-below-MinRAMSpace", "large"],
)
def test_limit_bytes(mem_mb: int, limit: int) -> None:
    assert memcg.limit_bytes(mem_mb) == limit


NODE = NodeConfig("gpu01", 16, 65536, 4, None, ())


@pytest.mark.parametrize(
    ("mem_mb", "node", "limit_mb"),
    [
        (64, NODE, 64),
        (0, NODE, 65536),
        (500, NodeConfig("gpu02", 16, 1024, 4, None, ()), 500),
        (500, NodeConfig("elsewhere", 16, 1024, 4, None, ()), 1024),
    ],
    ids=["--mem", "no-memory-asked: the node's", "second-node-of-the-run", "node-not-in-the-run"],
)
def test_memory_limit_of_a_run_on_a_node(mem_mb: int, node: NodeConfig, limit_mb: int) -> None:
    order = launch(mem_mb=mem_mb)  # gpu01 and gpu02, each with mem_mb
    assert memory_limit_mb(order, node) == limit_mb
