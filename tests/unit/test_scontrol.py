"""scontrol: command parsing, Slurm's ``show job`` record and error lines (no cluster needed)."""

from __future__ import annotations

from datetime import UTC

import pytest
from builders import T0

from corral.cli.errors import CliError
from corral.cli.jobrefs import JobRef
from corral.cli.scontrol import control_ids, failure_lines, main, update_request
from corral.cli.scontrol_show_job import output_path, record, show_job
from corral.schemas import api

pytestmark = pytest.mark.unit


def info(**fields: object) -> api.JobInfo:
    """A pending one-node job 7 of alice, with ``fields`` changed."""
    base: dict[str, object] = {
        "job_id": 7,
        "name": "train",
        "user": "alice",
        "account": "ml",
        "partition": "gpu",
        "state": "PENDING",
        "reason": "Dependency",
        "submit_time": T0,
        "start_time": None,
        "end_time": None,
        "time_limit_s": 3600,
        "num_nodes": 1,
        "num_cpus": 4,
        "num_tasks": 2,
        "gpus_per_node": 2,
        "gpu_type": None,
        "min_memory_mb": None,
        "node_list": "",
        "restart_count": 0,
        "priority": 1,
        "workdir": "/home/alice/run",
        "dependency": "afterok:5(unfulfilled)",
    }
    base.update(fields)
    return api.JobInfo(**base)  # type: ignore[arg-type]


def lookup(user: str) -> tuple[int, str, int] | None:
    return (1000, "staff", 50) if user == "alice" else None


def test_show_job_of_a_pending_job() -> None:
    """Every field of Slurm 22.05's record, in its order, with its unset values ((null), N/A, Unknown)."""
    assert show_job(info(), T0 + 10, lookup, UTC) == [
        "JobId=7 JobName=train",
        "UserId=alice(1000) GroupId=staff(50) MCS_label=N/A",
        "Priority=1 Nice=0 Account=ml QOS=normal",
        "JobState=PENDING Reason=Dependency Dependency=afterok:5(unfulfilled)",
        "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
        "RunTime=00:00:00 TimeLimit=01:00:00 TimeMin=N/A",
        "SubmitTime=2023-11-14T22:13:20 EligibleTime=Unknown",
        "AccrueTime=Unknown",
        "StartTime=Unknown EndTime=Unknown Deadline=N/A",
        "SuspendTime=None SecsPreSuspend=0 LastSchedEval=Unknown Scheduler=Main",
        "Partition=gpu AllocNode:Sid=(null):0",
        "ReqNodeList=(null) ExcNodeList=(null)",
        "NodeList=(null)",
        "NumNodes=1 NumCPUs=4 NumTasks=2 CPUs/Task=2 ReqB:S:C:T=0:0:*:*",
        "TRES=cpu=4,node=1,billing=4,gres/gpu=2",
        "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
        "MinCPUsNode=2 MinMemoryNode=0 MinTmpDiskNode=0",
        "Features=(null) DelayBoot=00:00:00",
        "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
        "Command=(null)",
        "WorkDir=/home/alice/run",
        "StdErr=/home/alice/run/slurm-7.out",
        "StdIn=/dev/null",
        "StdOut=/home/alice/run/slurm-7.out",
        "Power=",
        "TresPerNode=gres:gpu:2",
    ]


def test_show_job_of_a_running_job() -> None:
    running = info(
        state="RUNNING",
        reason="None",
        dependency="",
        start_time=T0 + 60,
        node_list="gpu[01-02]",
        num_nodes=2,
        time_limit_s=None,
        stdout="logs/%x-%j.out",
        stderr="/tmp/%u-%N.err",
        user="nobody-here",
        begin_time=T0 + 30,
        priority=4200,
        min_memory_mb=16384,
        gpu_type="h100",
        cpus_per_task=2,
        ntasks_per_node=1,
        command="/home/alice/run/train.sh",
        features="ib&a100",
        req_nodes="gpu[01-02]",
        exc_nodes="gpu05",
        reservation="maint",
        exclusive=True,
        cpus_per_gpu=1,
        alloc_node="login1",
        last_sched_eval=T0 + 60,
    )
    lines = show_job(running, T0 + 125, lookup, UTC)
    assert lines[2] == "Priority=4200 Nice=0 Account=ml QOS=normal"
    assert "UserId=nobody-here GroupId=(null) MCS_label=N/A" in lines
    assert "JobState=RUNNING Reason=None Dependency=(null)" in lines
    assert "RunTime=00:01:05 TimeLimit=UNLIMITED TimeMin=N/A" in lines
    assert "SubmitTime=2023-11-14T22:13:20 EligibleTime=2023-11-14T22:13:50" in lines
    assert "AccrueTime=2023-11-14T22:13:50" in lines
    assert "StartTime=2023-11-14T22:14:20 EndTime=Unknown Deadline=N/A" in lines
    assert "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2023-11-14T22:14:20 Scheduler=Main" in lines
    assert "Partition=gpu AllocNode:Sid=login1:0" in lines
    assert "ReqNodeList=gpu[01-02] ExcNodeList=gpu05" in lines
    at = lines.index("NodeList=gpu[01-02]")
    assert lines[at + 1 : at + 9] == [
        "BatchHost=gpu01",
        "NumNodes=2 NumCPUs=4 NumTasks=2 CPUs/Task=2 ReqB:S:C:T=0:0:*:*",
        "TRES=cpu=4,mem=32G,node=2,billing=4,gres/gpu=4",
        "Socks/Node=* NtasksPerN:B:S:C=1:0:*:* CoreSpec=*",
        "MinCPUsNode=2 MinMemoryNode=16G MinTmpDiskNode=0",
        "Features=ib&a100 DelayBoot=00:00:00",
        "Reservation=maint",
        "OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null)",
    ]
    assert "Command=/home/alice/run/train.sh" in lines
    assert "StdOut=/home/alice/run/logs/train-7.out" in lines
    assert "StdErr=/tmp/nobody-here-gpu01.err" in lines
    assert lines[-3:] == ["Power=", "CpusPerTres=gres:gpu:h100:1", "TresPerNode=gres:gpu:h100:2"]


def test_a_reason_with_spaces_has_underscores_as_in_slurm() -> None:
    lines = show_job(info(state="FAILED", reason="LaunchFailed, cannot open /w/1.out"), T0, lookup, UTC)
    assert (
        "JobState=FAILED Reason=LaunchFailed,_cannot_open_/w/1.out Dependency=afterok:5(unfulfilled)" in lines
    )


def test_an_allocation_is_no_batch_job_and_has_no_files() -> None:
    """salloc/srun's job: BatchFlag=0 and no StdErr/StdIn/StdOut lines, as Slurm prints only a batch job's."""
    lines = show_job(info(batch=False), T0, lookup, UTC)
    assert "Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:0" in lines
    assert not [line for line in lines if line.startswith(("StdErr=", "StdIn=", "StdOut="))]
    assert lines[lines.index("WorkDir=/home/alice/run") + 1] == "Power="


def test_gpus_per_task_is_tres_per_task() -> None:
    assert show_job(info(gpus_per_task=1), T0, lookup, UTC)[-1] == "TresPerTask=gres:gpu:1"


def test_record_ends_each_line_with_the_separator_as_slurm() -> None:
    """Slurm ends every field line with its separator, the last too: a line of three spaces (``-o``: a
    trailing space), then the blank line between records."""
    assert record(["JobId=7 JobName=a", "Power="], oneliner=False) == "JobId=7 JobName=a\n   Power=\n   \n\n"
    assert record(["JobId=7 JobName=a", "Power="], oneliner=True) == "JobId=7 JobName=a Power= \n"


def test_output_path_leaves_unknown_patterns() -> None:
    assert output_path("%N-%a-%%-%j", info()) == "/home/alice/run/%N-%a-%-7"


@pytest.mark.parametrize(
    ("words", "ids"),
    [
        (["5"], [5]),
        (["5,6", "7"], [5, 6, 7]),
        (["JobId=8"], [8]),
        (["5", "5"], [5]),
        (["5_2,5_[0-1,4]"], [JobRef(5, (2,)), JobRef(5, (0, 1, 4))]),
    ],
    ids=["one", "lists", "jobid=", "repeated", "array tasks"],
)
def test_control_ids(words: list[str], ids: list[int | JobRef]) -> None:
    assert control_ids(words, "hold") == [JobRef(i) if isinstance(i, int) else i for i in ids]


@pytest.mark.parametrize(
    ("words", "message"),
    [
        ([], "scontrol hold needs a job id"),
        (["x"], "Invalid job id x"),
        (["5_"], "Invalid job id 5_"),
        (["Name=x"], "scontrol hold Name=x: only job ids are supported by Corral yet"),
    ],
    ids=["none", "not a number", "array", "by name"],
)
def test_control_ids_refused(words: list[str], message: str) -> None:
    with pytest.raises(CliError) as exc:
        control_ids(words, "hold")
    assert exc.value.message == message


def test_failure_lines_name_each_job() -> None:
    reply = api.ControlReply(
        outcomes=[
            api.JobOutcome(job_id=5),
            api.JobOutcome(job_id=6, error="Job is no longer pending execution"),
        ]
    )
    assert failure_lines(reply) == ["scontrol: error: Job is no longer pending execution for job 6"]


@pytest.mark.parametrize(
    ("argv", "err"),
    [
        ([], "scontrol: error: no command given: use hold, release or show (scontrol --help)\n"),
        (["frobnicate"], "scontrol: error: invalid keyword: frobnicate\n"),
        (["suspend", "5"], "scontrol: error: scontrol suspend is not supported by Corral yet\n"),
        (["show", "config"], "scontrol: error: scontrol show config is not supported by Corral yet\n"),
        (["show", "fish"], "scontrol: error: invalid entity: fish for keyword: show\n"),
        (["-M", "x", "show", "job"], "scontrol: error: option --clusters is not supported by Corral yet\n"),
    ],
    ids=["nothing", "unknown", "later command", "later entity", "unknown entity", "unsupported option"],
)
def test_refusals_are_one_error_line(argv: list[str], err: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    assert capsys.readouterr() == ("", err)


def test_show_hostnames_and_hostlist(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["show", "hostnames", "gpu[01-03]"]) == 0
    assert capsys.readouterr().out == "gpu01\ngpu02\ngpu03\n"
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    assert main(["SHOW", "HostNames"]) == 0
    assert capsys.readouterr().out == "n1\nn2\n"
    assert main(["show", "hostlist", "gpu01,gpu02,gpu04"]) == 0
    assert capsys.readouterr().out == "gpu[01-02,04]\n"


@pytest.mark.parametrize(
    ("words", "wanted"),
    [
        (["JobId=5", "TimeLimit=30"], api.UpdateRequest(job_id=5, time_limit_s=1800)),
        (["jobid=5", "partition=cpu"], api.UpdateRequest(job_id=5, partition="cpu")),
        (
            ["TimeLimit=1:00:00", "JOBID=5", "Partition=gpu"],
            api.UpdateRequest(job_id=5, time_limit_s=3600, partition="gpu"),
        ),
        (["JobId=5", "Priority=1000"], api.UpdateRequest(job_id=5, priority=1000)),
        (["JobId=5", "priority=0"], api.UpdateRequest(job_id=5, priority=0)),
    ],
    ids=["time limit", "partition", "both, any order", "priority", "priority 0 (hold)"],
)
def test_update_request(words: list[str], wanted: api.UpdateRequest) -> None:
    assert update_request(words) == wanted


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["TimeLimit=30"], "scontrol update needs JobId=ID"),
        (["JobId=5"], "scontrol update: give TimeLimit=, Partition= or Priority= to change"),
        (["JobId=5", "Nice=10"], "scontrol update: changing Nice is not supported by Corral yet"),
        (["JobId=5", "Priority=-1"], "Priority=-1: give a whole number >= 0 (0 holds the job)"),
        (["PartitionName=gpu", "State=UP"], "scontrol update PartitionName= is not supported by Corral yet"),
        (["JobId=5", "TimeLimit=+30"], "TimeLimit=+30 is not supported by Corral yet: give a time"),
        (
            ["JobId=5", "TimeLimit=UNLIMITED"],
            "TimeLimit=UNLIMITED is not supported by Corral yet: give a time",
        ),
        (
            ["JobId=5,6", "TimeLimit=5"],
            "scontrol update of several jobs at once is not supported by Corral yet",
        ),
        (
            ["JobId=5", "oops"],
            "scontrol update oops: use KEY=VALUE (JobId=, TimeLimit=, Partition=, Priority=)",
        ),
    ],
    ids=[
        "no job",
        "no change",
        "nice",
        "negative priority",
        "node",
        "relative",
        "unlimited",
        "two jobs",
        "not key=value",
    ],
)
def test_update_refusals(words: list[str], message: str) -> None:
    with pytest.raises(CliError) as exc:
        update_request(words)
    assert exc.value.message == message
