"""scontrol show node / partition: Slurm's key=value records from the nodes reply (pure)."""

from __future__ import annotations

import pytest

from corral.cli import scontrol_nodes
from corral.cli.errors import CliError
from corral.schemas.api import NodeInfo, NodesReply, PartitionInfo

pytestmark = pytest.mark.unit

REPLY = NodesReply(
    nodes=[
        NodeInfo(name="gpu01", state="mixed", reason="", cpus=16, alloc_cpus=4, mem_mb=65536,
                 alloc_mem_mb=1024, gpus=4, alloc_gpus=2, gpu_type="h100", partitions=["gpu"],
                 features=["ib"]),
        NodeInfo(name="gpu02", state="down", reason="Not responding", cpus=16, alloc_cpus=0, mem_mb=65536,
                 alloc_mem_mb=0, gpus=0, alloc_gpus=0, gpu_type=None, partitions=["gpu"]),
    ],
    partitions=[
        PartitionInfo(name="gpu", default=True, max_time_s=86400, default_time_s=3600,
                      nodes=["gpu01", "gpu02"]),
        PartitionInfo(name="empty", default=False, max_time_s=None, default_time_s=None, nodes=[],
                      priority_tier=3, max_nodes=4, qos="high", allow_qos=["high"],
                      allow_accounts=["ml", "cv"], preempt_mode="REQUEUE", grace_time_s=30),
    ],
)  # fmt: skip


def test_show_node() -> None:
    """Every field of Slurm 22.05's node record, in its order, trailing spaces and unset values included."""
    assert scontrol_nodes.records("node", "gpu01", REPLY) == [
        [
            "NodeName=gpu01 CoresPerSocket=1 ",
            "CPUAlloc=4 CPUEfctv=16 CPUTot=16 CPULoad=N/A",
            "AvailableFeatures=ib",
            "ActiveFeatures=ib",
            "Gres=gpu:h100:4",
            "NodeAddr=gpu01 NodeHostName=gpu01 ",
            "RealMemory=65536 AllocMem=1024 FreeMem=N/A Sockets=16 Boards=1",
            "State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
            "Partitions=gpu ",
            "BootTime=None SlurmdStartTime=None",
            "LastBusyTime=Unknown",
            "CfgTRES=cpu=16,mem=64G,billing=16,gres/gpu=4",
            "AllocTRES=cpu=4,mem=1G,gres/gpu=2",
            "CapWatts=n/a",
            "CurrentWatts=n/s AveWatts=n/s",
            "ExtSensorsJoules=n/s ExtSensorsWatts=n/s ExtSensorsTemp=n/s",
        ]
    ]


def test_show_down_node_has_its_reason_and_every_node_without_a_name() -> None:
    shown = scontrol_nodes.records("node", None, REPLY)
    assert [r[0] for r in shown] == ["NodeName=gpu01 CoresPerSocket=1 ", "NodeName=gpu02 CoresPerSocket=1 "]
    assert "State=DOWN* ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A" in shown[1]
    assert shown[1][-1] == "Reason=Not responding"
    assert "Gres=(null)" in shown[1]
    assert "AllocTRES=" in shown[1]


def test_show_partition() -> None:
    """Every field of Slurm 22.05's partition record; the settings Corral lacks print Slurm's defaults."""
    assert scontrol_nodes.records("partition", None, REPLY) == [
        [
            "PartitionName=gpu",
            "AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL",
            "AllocNodes=ALL Default=YES QoS=N/A",
            "DefaultTime=01:00:00 DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 Hidden=NO",
            "MaxNodes=UNLIMITED MaxTime=1-00:00:00 MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED",
            "Nodes=gpu[01-02]",
            "PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO",
            "OverTimeLimit=NONE PreemptMode=OFF",
            "State=UP TotalCPUs=32 TotalNodes=2 SelectTypeParameters=NONE",
            "JobDefaults=(null)",
            "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED",
            "TRES=cpu=32,mem=128G,node=2,billing=32,gres/gpu=4",
        ],
        [
            "PartitionName=empty",
            "AllowGroups=ALL AllowAccounts=ml,cv AllowQos=high",
            "AllocNodes=ALL Default=NO QoS=high",
            "DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=30 Hidden=NO",
            "MaxNodes=4 MaxTime=UNLIMITED MinNodes=0 LLN=NO MaxCPUsPerNode=UNLIMITED",
            "Nodes=(null)",
            "PriorityJobFactor=3 PriorityTier=3 RootOnly=NO ReqResv=NO OverSubscribe=NO",
            "OverTimeLimit=NONE PreemptMode=REQUEUE",
            "State=UP TotalCPUs=0 TotalNodes=0 SelectTypeParameters=NONE",
            "JobDefaults=(null)",
            "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED",
            "TRES=cpu=0,mem=0,node=0,billing=0",
        ],
    ]


@pytest.mark.parametrize(
    ("entity", "name", "message"),
    [("node", "gpu09", "Node gpu09 not found"), ("partition", "nope", "Partition nope not found")],
    ids=["node", "partition"],
)
def test_show_unknown_names(entity: str, name: str, message: str) -> None:
    with pytest.raises(CliError, match=message):
        scontrol_nodes.records(entity, name, REPLY)
