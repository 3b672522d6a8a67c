"""sinfo -t, -R and -s: node state filters, reasons and per-partition node counts (pure rendering)."""

from __future__ import annotations

import msgspec
import pytest

from corral.cli import sinfo
from corral.cli.errors import CliError
from corral.schemas.api import NodeInfo, NodesReply, PartitionInfo

pytestmark = pytest.mark.unit


def node(name: str, state: str = "idle", reason: str = "") -> NodeInfo:
    """A 16-CPU node with 4 GPUs in partition gpu."""
    return NodeInfo(
        name=name, state=state, reason=reason, cpus=16, alloc_cpus=8 if state == "mixed" else 0,
        mem_mb=65536, alloc_mem_mb=0, gpus=4, alloc_gpus=0, gpu_type="sim", partitions=["gpu"],
    )  # fmt: skip


REPLY = NodesReply(
    nodes=[
        node("gpu01"),
        node("gpu02", "mixed"),
        node("gpu03", "down", "Not responding"),
        node("gpu04", "drained", "bad gpu"),
    ],
    partitions=[
        PartitionInfo(name="gpu", default=True, max_time_s=3600, default_time_s=None,
                      nodes=["gpu01", "gpu02", "gpu03", "gpu04"]),
        PartitionInfo(name="cpu", default=False, max_time_s=None, default_time_s=None, nodes=["gpu01"]),
    ],
)  # fmt: skip


def lines(fmt: str, states: list[str] | None = None, **options: bool) -> list[str]:
    """sinfo's lines for REPLY with ``-o fmt`` and ``-t states``."""
    reply = sinfo.with_states(REPLY, sinfo.parse_node_states(states or []))
    return sinfo.render_sinfo(reply, sinfo.parse_format(fmt, options.get("node_oriented", False)), **options)


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (["idle"], ["gpu* idle gpu01", "cpu idle gpu01"]),
        (["mix,down"], ["gpu* mix gpu02", "gpu* down* gpu03"]),
        (["ALLOC"], []),
        (["drain"], ["gpu* drain gpu04"]),
        ([], ["gpu* idle gpu01", "gpu* mix gpu02", "gpu* down* gpu03", "gpu* drain gpu04", "cpu idle gpu01"]),
    ],
    ids=["idle", "two", "none-match", "drain", "all"],
)
def test_sinfo_states_filter(states: list[str], expected: list[str]) -> None:
    items = [s for text in states for s in text.split(",")]
    assert lines("%P %t %N", items, header=False, node_oriented=True) == expected


def test_sinfo_list_reasons() -> None:
    reasons = sinfo.with_states(REPLY, {"down", "drained", "unknown"})
    layout = sinfo.parse_format(sinfo.REASONS_FORMAT, False)
    assert sinfo.render_sinfo(reasons, layout) == [
        "REASON               USER      TIMESTAMP           NODELIST",
        "Not responding       slurm     Unknown             gpu03",
        "bad gpu              slurm     Unknown             gpu04",
    ]


def test_sinfo_summarize() -> None:
    assert lines(sinfo.SUMMARIZE_FORMAT) == [
        "PARTITION AVAIL  TIMELIMIT   NODES(A/I/O/T)  NODELIST",
        "gpu*         up    1:00:00          1/1/2/4  gpu[01-04]",
        "cpu          up   infinite          0/1/0/1  gpu01",
    ]


def test_sinfo_bad_state() -> None:
    with pytest.raises(CliError, match="invalid node state specified: sleepy"):
        sinfo.parse_node_states(["sleepy"])


def test_with_states_keeps_the_reply_when_no_filter() -> None:
    assert msgspec.structs.asdict(sinfo.with_states(REPLY, set())) == msgspec.structs.asdict(REPLY)


@pytest.mark.parametrize(
    ("hostlists", "expected"),
    [
        (["gpu01"], ["gpu* idle gpu01", "cpu idle gpu01"]),
        (["gpu[02-03]"], ["gpu* mix gpu02", "gpu* down* gpu03"]),
        (["gpu04", "gpu09"], ["gpu* drain gpu04"]),
        (["gpu09"], []),
    ],
    ids=["one", "range", "two-options", "unknown"],
)
def test_sinfo_nodes_filter(hostlists: list[str], expected: list[str]) -> None:
    reply = sinfo.with_nodes(REPLY, sinfo.parse_nodes(hostlists))
    layout = sinfo.parse_format("%P %t %N", True)
    assert sinfo.render_sinfo(reply, layout, header=False, node_oriented=True) == expected


def test_sinfo_bad_nodes_hostlist() -> None:
    from corral.libs.slurm.errors import FormatError

    with pytest.raises(FormatError, match=r'invalid --nodes "gpu\[1-"'):
        sinfo.parse_nodes(["gpu[1-"])
