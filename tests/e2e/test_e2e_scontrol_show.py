"""scontrol show job|node|partition on a real cluster: Slurm 22.05's keys, in its order (issue 15, item 5)."""

from __future__ import annotations

import pytest
from e2e_cli import Cli

pytestmark = pytest.mark.e2e


def keys(text: str) -> list[str]:
    """A record's keys, written as one string."""
    return text.split()


#: The keys of Slurm 22.05's job record (src/api/job_info.c) for a running batch job asking for one GPU.
JOB_KEYS = keys(
    "JobId JobName UserId GroupId MCS_label Priority Nice Account QOS JobState Reason Dependency Requeue "
    "Restarts BatchFlag Reboot ExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime AccrueTime "
    "StartTime EndTime Deadline SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition AllocNode:Sid "
    "ReqNodeList ExcNodeList NodeList BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES "
    "Socks/Node NtasksPerN:B:S:C CoreSpec MinCPUsNode MinMemoryNode MinTmpDiskNode Features DelayBoot "
    "OverSubscribe Contiguous Licenses Network Command WorkDir StdErr StdIn StdOut Power TresPerNode"
)
NODE_KEYS = keys(
    "NodeName CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures ActiveFeatures Gres NodeAddr "
    "NodeHostName RealMemory AllocMem FreeMem Sockets Boards State ThreadsPerCore TmpDisk Weight Owner "
    "MCS_label Partitions BootTime SlurmdStartTime LastBusyTime CfgTRES AllocTRES CapWatts CurrentWatts "
    "AveWatts ExtSensorsJoules ExtSensorsWatts ExtSensorsTemp"
)
PARTITION_KEYS = keys(
    "PartitionName AllowGroups AllowAccounts AllowQos AllocNodes Default QoS DefaultTime DisableRootJobs "
    "ExclusiveUser GraceTime Hidden MaxNodes MaxTime MinNodes LLN MaxCPUsPerNode Nodes PriorityJobFactor "
    "PriorityTier RootOnly ReqResv OverSubscribe OverTimeLimit PreemptMode State TotalCPUs TotalNodes "
    "SelectTypeParameters JobDefaults DefMemPerNode MaxMemPerNode TRES"
)


def fields(record: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in record.split())


def test_show_job_node_and_partition_print_slurms_fields_in_slurms_order(cli: Cli) -> None:
    (cli.workdir / "show.sh").write_text("#!/bin/sh\nsleep 300\n")
    out = cli("sbatch", "--parsable", "--gres=gpu:1", "-J", "shown", "show.sh")
    assert out.returncode == 0, out.stderr
    job = int(out.stdout)
    try:
        cli.wait_state(job, ("RUNNING",))
        shown = cli("scontrol", "show", "job", str(job))
        assert shown.returncode == 0, shown.stderr
        # Every line ends with Slurm's separator, the last one too, then the blank line.
        assert shown.stdout.startswith(f"JobId={job} JobName=shown\n   UserId=")
        assert shown.stdout.endswith("\n   Power=\n   TresPerNode=gres:gpu:1\n   \n\n"), shown.stdout
        record = fields(shown.stdout)
        assert list(record) == JOB_KEYS, shown.stdout
        assert record["Command"] == str(cli.workdir / "show.sh")
        assert record["BatchHost"] == record["NodeList"] and record["BatchHost"].startswith("node")
        assert record["Priority"] != "0" and record["ExcNodeList"] == "(null)"
        assert "gres/gpu=1" in record["TRES"] and "billing=" in record["TRES"]
        one = cli("scontrol", "-o", "show", "job", str(job)).stdout
        assert one.endswith(" TresPerNode=gres:gpu:1 \n") and one.count("\n") == 1, one

        node = cli("scontrol", "show", "node", record["BatchHost"]).stdout
        assert list(fields(node)) == NODE_KEYS, node
        assert f"NodeName={record['BatchHost']} CoresPerSocket=1 \n" in node
        partition = cli("scontrol", "show", "partition", record["Partition"]).stdout
        assert list(fields(partition)) == PARTITION_KEYS, partition
    finally:
        cli("scancel", str(job))
