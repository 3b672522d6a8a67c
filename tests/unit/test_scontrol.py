"""scontrol: command parsing, Slurm's ``show job`` record and error lines (no cluster needed)."""

from __future__ import annotations

from datetime import UTC

import pytest
from builders import T0

from corral.cli.errors import CliError
from corral.cli.jobrefs import JobRef
from corral.cli.scontrol import control_ids, failure_lines, main, update_request
from corral.cli.scontrol_show_job import output_path, show_job
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
    assert show_job(info(), T0 + 10, lookup, UTC) == [
        "JobId=7 JobName=train",
        "UserId=alice(1000) GroupId=staff(50) MCS_label=N/A",
        "Priority=1 Nice=0 Account=ml QOS=normal",
        "JobState=PENDING Reason=Dependency Dependency=afterok:5(unfulfilled)",
        "Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0",
        "RunTime=00:00:00 TimeLimit=01:00:00 TimeMin=N/A",
        "SubmitTime=2023-11-14T22:13:20 EligibleTime=Unknown",
        "StartTime=Unknown EndTime=Unknown Deadline=N/A",
        "Partition=gpu AllocNode:Sid=(null):0",
        "NodeList=(null)",
        "NumNodes=1 NumCPUs=4 NumTasks=2 CPUs/Task=2",
        "TRES=cpu=4,node=1,gres/gpu=2",
        "MinMemoryNode=0",
        "WorkDir=/home/alice/run",
        "StdErr=/home/alice/run/slurm-7.out",
        "StdIn=/dev/null",
        "StdOut=/home/alice/run/slurm-7.out",
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
    )
    lines = show_job(running, T0 + 125, lookup, UTC)
    assert "UserId=nobody-here GroupId=(null) MCS_label=N/A" in lines
    assert "JobState=RUNNING Reason=None Dependency=(null)" in lines
    assert "RunTime=00:01:05 TimeLimit=UNLIMITED TimeMin=N/A" in lines
    assert "SubmitTime=2023-11-14T22:13:20 EligibleTime=2023-11-14T22:13:50" in lines
    assert "StartTime=2023-11-14T22:14:20 EndTime=Unknown Deadline=N/A" in lines
    assert "NodeList=gpu[01-02]" in lines
    assert "StdOut=/home/alice/run/logs/train-7.out" in lines
    assert "StdErr=/tmp/nobody-here-gpu01.err" in lines


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
