"""squeue, sacct, sinfo and scancel output, rendered from hand-built replies at a fixed clock, in UTC."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import pytest

from corral.cli import sacct, scancel, sinfo, squeue, squeue_sort
from corral.cli.errors import CliError
from corral.cli.jobrefs import JobRef
from corral.cli.sacct_fields import parse_time_point
from corral.libs.slurm.errors import FormatError
from corral.schemas.api import (
    AcctJob,
    AcctStep,
    CancelOutcome,
    CancelReply,
    JobInfo,
    NodeInfo,
    NodesReply,
    PartitionInfo,
)

pytestmark = pytest.mark.unit

#: 2023-11-14T22:13:20 UTC.
T0 = 1_700_000_000.0
UID = {"alice": "1000"}.get


def job(**fields: Any) -> JobInfo:
    """A running two-node job of alice's, started 10 s after T0."""
    values: dict[str, Any] = {
        "job_id": 42, "name": "train", "user": "alice", "account": "proj", "partition": "gpu",
        "state": "RUNNING", "reason": "None", "submit_time": T0, "start_time": T0 + 10, "end_time": None,
        "time_limit_s": 3600, "num_nodes": 2, "num_cpus": 16, "num_tasks": 2, "gpus_per_node": 4,
        "gpu_type": None, "min_memory_mb": 8192, "node_list": "gpu[01-02]", "restart_count": 0,
        "priority": 100, "workdir": "/home/alice/run",
    }  # fmt: skip
    return JobInfo(**(values | fields))


def pending(**fields: Any) -> JobInfo:
    return job(state="PENDING", reason="Priority", start_time=None, node_list="", **fields)


def step(**fields: Any) -> AcctStep:
    values: dict[str, Any] = {
        "step": "batch", "name": "batch", "state": "COMPLETED", "exit_code": 0, "signal": 0,
        "start_time": T0 + 10, "end_time": T0 + 70, "node_list": "gpu01", "num_cpus": 8, "num_tasks": 1,
        "num_gpus": 4,
    }  # fmt: skip
    return AcctStep(**(values | fields))


def acct_job(**fields: Any) -> AcctJob:
    """Job 5 of alice's, completed after one minute, with its batch step."""
    values: dict[str, Any] = {
        "job_id": 5, "name": "train", "user": "alice", "account": "proj", "partition": "gpu",
        "state": "COMPLETED", "cancelled_by": None, "exit_code": 0, "signal": 0, "submit_time": T0,
        "start_time": T0 + 10, "end_time": T0 + 70, "time_limit_s": 3600, "num_nodes": 1, "num_cpus": 16,
        "num_gpus": 4, "node_list": "gpu01", "restart_count": 0, "workdir": "/home/alice/run",
        "reason": "None", "steps": [step()],
    }  # fmt: skip
    return AcctJob(**(values | fields))


# --- squeue ---------------------------------------------------------------------------------------


def squeue_lines(argv: list[str], jobs: list[JobInfo], now: float = T0 + 13) -> list[str]:
    args = squeue.parse_args(argv)
    return squeue.render_jobs(jobs, args.layout, header=args.header, now=now, tz=UTC)


def test_squeue_default_format() -> None:
    jobs = [job(name="train-long-name"), pending(job_id=43)]
    assert squeue_lines([], jobs) == [
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)",
        "                42       gpu train-lo    alice  R       0:03      2 gpu[01-02]",
        "                43       gpu    train    alice PD       0:00      2 (Priority)",
    ]


def test_squeue_keeps_pending_jobs_that_are_no_array_tasks_apart() -> None:
    jobs = [pending(job_id=43), pending(job_id=44)]
    assert squeue.aggregate_arrays(jobs) == (jobs, {})


def test_squeue_noheader_and_custom_widths() -> None:
    assert squeue_lines(["-h", "-o", "%-10j|%5D|%.5D|%i"], [job()]) == ["train     |2    |    2|42"]


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(3, "0:03"), (65, "1:05"), (3725, "1:02:05"), (90061, "1-01:01:01")],
    ids=["seconds", "minutes", "hours", "days"],
)
def test_squeue_elapsed_forms(seconds: int, shown: str) -> None:
    assert squeue_lines(["-h", "-o", "%M"], [job()], now=T0 + 10 + seconds) == [shown]


@pytest.mark.parametrize(
    ("state", "code"),
    [("PENDING", "PD"), ("RUNNING", "R"), ("COMPLETING", "CG"), ("COMPLETED", "CD"), ("FAILED", "F"),
     ("CANCELLED", "CA"), ("TIMEOUT", "TO"), ("NODE_FAIL", "NF"), ("OUT_OF_MEMORY", "OOM")],
)  # fmt: skip
def test_squeue_compact_states(state: str, code: str) -> None:
    assert squeue_lines(["-h", "-o", "%t|%T"], [job(state=state)]) == [f"{code}|{state}"]


def test_squeue_every_field() -> None:
    fmt = "%L|%l|%b|%m|%C|%Q|%a|%u|%P|%r|%N|%Z|%S|%V"
    assert squeue_lines(["-o", fmt], [job(), pending(gpu_type="h100", time_limit_s=None)]) == [
        "TIME_LEFT|TIME_LIMIT|TRES_PER_NODE|MIN_MEMORY|CPUS|PRIORITY|ACCOUNT|USER|PARTITION|REASON|NODELIST"
        "|WORK_DIR|START_TIME|SUBMIT_TIME",
        "59:57|1:00:00|gres:gpu:4|8G|16|100|proj|alice|gpu|None|gpu[01-02]|/home/alice/run"
        "|2023-11-14T22:13:30|2023-11-14T22:13:20",
        "UNLIMITED|UNLIMITED|gres:gpu:h100:4|8G|16|100|proj|alice|gpu|Priority||/home/alice/run"
        "|N/A|2023-11-14T22:13:20",
    ]


def test_squeue_reason_of_a_failed_job() -> None:
    failed = job(state="FAILED", reason="NonZeroExitCode", end_time=T0 + 20)
    assert squeue_lines(["-h", "-o", "%R %M"], [failed], now=T0 + 500) == ["(NonZeroExitCode) 0:10"]


def test_squeue_long_format_names() -> None:
    assert squeue_lines(["-O", "JobID:6,Name:.8,state"], [job()]) == [
        "JOBID     NAMESTATE               ",
        "42       trainRUNNING             ",
    ]


def test_squeue_start_shows_pending_jobs_with_unknown_start() -> None:
    args = squeue.parse_args(["--start"])
    jobs = squeue.select_jobs([job(), pending(job_id=43)], args)
    assert squeue.render_jobs(jobs, args.layout, header=True, now=T0, tz=UTC) == [
        "             JOBID PARTITION     NAME     USER ST          START_TIME  NODES SCHEDNODES           "
        "NODELIST(REASON)",
        "                43       gpu    train    alice PD                 N/A      2 (null)               "
        "(Priority)",
    ]


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["-w", "gpu01"], [42]),
        (["--nodelist=gpu[02-03]"], [42, 44]),
        (["-w", "gpu03", "-w", "gpu09"], [44]),
        (["-w", "gpu09"], []),
        (["-q", "high"], [44]),
        (["--qos=normal,high"], [42, 43, 44]),
        (["-w", "gpu01", "-q", "high"], []),
    ],
)
def test_squeue_nodelist_and_qos_filters(argv: list[str], shown: list[int]) -> None:
    jobs = [
        job(qos="normal"),
        pending(job_id=43, qos="normal"),
        job(job_id=44, node_list="gpu03", qos="high"),
    ]
    args = squeue.parse_args(argv)
    assert [j.job_id for j in squeue.select_jobs(jobs, args)] == shown


def test_squeue_bad_nodelist() -> None:
    with pytest.raises(FormatError, match=r'invalid --nodelist "gpu\[1-": '):
        squeue.parse_args(["-w", "gpu[1-"])


def test_squeue_request_filters() -> None:
    args = squeue.parse_args(["-j", "5", "-j", "6,7", "-t", "pd,Running", "--me", "-u", "bob", "-p", "gpu"])
    request = squeue.jobs_request(args, "alice")
    assert (request.job_ids, request.users, request.partitions) == ([5, 6, 7], ["bob", "alice"], ["gpu"])
    assert (request.states, request.include_finished) == (["PENDING", "RUNNING"], True)
    everything = squeue.jobs_request(squeue.parse_args(["-t", "all"]), "alice")
    assert (everything.states, everything.include_finished) == ([], True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["-t", "WAITING"],
            'invalid --states "WAITING": use job states like PENDING,RUNNING or codes like PD,R',
        ),
        (["-o", "%i %B"], "--format field %B is not supported by Corral yet"),
        (["-o", "%5"], 'invalid --format "%5": a "%" must be followed by a field letter'),
        (["-O", "JobID,Color"], 'invalid --Format field "Color": use one of '),
        (["-j", "12_x"], "Invalid job id 12_x"),
        (["--iterate=5"], "option --iterate is not supported by Corral yet"),
    ],
    ids=["state", "later letter", "dangling percent", "long name", "bad array task", "unsupported"],
)
def test_squeue_refusals(argv: list[str], message: str) -> None:
    with pytest.raises(CliError) as info:
        squeue.parse_args(argv)
    assert info.value.message.startswith(message)


# --- sacct ----------------------------------------------------------------------------------------


def sacct_lines(argv: list[str], jobs: list[AcctJob], now: float = T0 + 100) -> list[str]:
    args = sacct.parse_args(argv)
    return sacct.render_acct(
        jobs,
        args.columns,
        header=args.header,
        parsable=args.parsable,
        delimiter=args.delimiter,
        steps=args.steps,
        array=args.array,
        now=now,
        tz=UTC,
        uid_of=lambda user: UID(user, user),
    )


def test_sacct_default_fixed_width() -> None:
    assert sacct_lines([], [acct_job()]) == [
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode ",
        "------------ ---------- ---------- ---------- ---------- ---------- -------- ",
        "5                 train        gpu       proj         16  COMPLETED      0:0 ",
        "5.batch           batch                  proj          8  COMPLETED      0:0 ",
    ]


def test_sacct_submitit_query() -> None:
    argv = ["-o", "JobID,State,NodeList", "--parsable2", "-j", "5", "-j", "6,7"]
    assert sacct.parse_args(argv).job_ids == [5, 6, 7]
    assert sacct_lines(argv, [acct_job()]) == [
        "JobID|State|NodeList",
        "5|COMPLETED|gpu01",
        "5.batch|COMPLETED|gpu01",
    ]


def test_sacct_parsable_trailing_delimiter_noheader_allocations() -> None:
    assert sacct_lines(["-p", "-n", "-X", "-o", "jobid,STATE"], [acct_job()]) == ["5|COMPLETED|"]
    assert sacct_lines(["-P", "--delimiter=,", "-o", "JobIDRaw,ExitCode", "-X"], [acct_job(exit_code=1)]) == [
        "JobIDRaw,ExitCode",
        "5,1:0",
    ]


def test_sacct_cancelled_by_uid() -> None:
    cancelled = acct_job(state="CANCELLED", cancelled_by="alice", signal=15, steps=[])
    other = acct_job(job_id=6, state="CANCELLED", cancelled_by="nobody-here", signal=15, steps=[])
    assert sacct_lines(["-P", "-o", "State,ExitCode"], [cancelled, other]) == [
        "State|ExitCode",
        "CANCELLED by 1000|0:15",
        "CANCELLED by nobody-here|0:15",
    ]
    assert sacct_lines(["-n", "-o", "State"], [cancelled]) == ["CANCELLED+ "]


def test_sacct_width_suffix_and_truncation() -> None:
    long_name = acct_job(name="a-very-long-job-name", steps=[])
    assert sacct_lines(["-o", "JobName%25,JobName"], [long_name]) == [
        "                  JobName    JobName ",
        "------------------------- ---------- ",
        "     a-very-long-job-name a-very-lo+ ",
    ]


def test_sacct_pending_and_running_jobs() -> None:
    fields = "JobID,Elapsed,Start,End,Submit,NodeList,AllocCPUS,NCPUS,Timelimit,User,NNodes,State"
    waiting = acct_job(job_id=6, state="PENDING", start_time=None, end_time=None, node_list="", steps=[])
    running = acct_job(
        job_id=7, state="RUNNING", end_time=None, time_limit_s=None, steps=[step(end_time=None)]
    )
    assert sacct_lines(["-P", "-o", fields], [waiting, running], now=T0 + 3735) == [
        "JobID|Elapsed|Start|End|Submit|NodeList|AllocCPUS|NCPUS|Timelimit|User|NNodes|State",
        "6|00:00:00|Unknown|Unknown|2023-11-14T22:13:20|None assigned|0|16|01:00:00|alice|1|PENDING",
        "7|01:02:05|2023-11-14T22:13:30|Unknown|2023-11-14T22:13:20|gpu01|16|16|UNLIMITED|alice|1|RUNNING",
        "7.batch|01:02:05|2023-11-14T22:13:30|Unknown|2023-11-14T22:13:30|gpu01|8|8|||1|COMPLETED",
    ]


def test_sacct_qos_and_timelimit_raw() -> None:
    rows = [
        acct_job(qos="high", time_limit_s=3601),
        acct_job(job_id=6, qos="", time_limit_s=None, steps=[]),
    ]
    assert sacct_lines(["-P", "-o", "JobID,QOS,TimelimitRaw,Timelimit"], rows) == [
        "JobID|QOS|TimelimitRaw|Timelimit",
        "5|high|61|01:00:01",
        "5.batch|||",
        "6||UNLIMITED|UNLIMITED",
    ]
    assert sacct_lines(["-n", "-X", "-o", "qos%6"], rows[:1]) == ["  high "]


def test_sacct_request_defaults_to_the_callers_jobs() -> None:
    now = T0

    def users(argv: list[str]) -> list[str]:
        return sacct.acct_request(sacct.parse_args(argv), "alice", now).users

    assert (users([]), users(["-a"]), users(["-j", "5"]), users(["-u", "bob,carol"])) == (
        ["alice"],
        [],
        [],
        ["bob", "carol"],
    )
    request = sacct.acct_request(
        sacct.parse_args(["-s", "CA,cd", "-S", "2024-03-01", "-E", "now"]), "a", now, UTC
    )
    assert (request.states, request.start_after, request.end_before) == (
        ["CANCELLED", "COMPLETED"],
        1709251200,
        now,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2024-03-01T12:30", 1709296200), ("2024-03-01T12:30:15", 1709296215), ("now-1hour", T0 - 3600),
     ("now-2days", T0 - 172800), ("now+30minutes", T0 + 1800), ("now-90", T0 - 90), ("NOW", T0)],
)  # fmt: skip
def test_sacct_time_points(text: str, expected: float) -> None:
    assert parse_time_point(text, "--starttime", T0, UTC) == expected


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-o", "JobID,Color"], 'Invalid field requested: "Color"'),
        (["-o", "MaxRSS"], "sacct field MaxRSS is not supported by Corral yet"),
        (["-o", "JobName%x"], 'invalid --format field "JobName%x": give a width as JobName%30'),
        (["-S", "yesterday"], None),
        (["--yaml"], "option --yaml is not supported by Corral yet"),
    ],
    ids=["unknown field", "later field", "bad width", "bad time", "yaml"],
)
def test_sacct_refusals(argv: list[str], message: str | None) -> None:
    with pytest.raises(CliError) as info:
        sacct.acct_request(sacct.parse_args(argv), "alice", T0)
    expected = message or 'invalid --starttime "yesterday": use YYYY-MM-DD[THH:MM[:SS]], now, now-1hours'
    assert info.value.message.startswith(expected)


# --- sinfo ----------------------------------------------------------------------------------------


def node(name: str, state: str = "idle", alloc_cpus: int = 0) -> NodeInfo:
    return NodeInfo(
        name=name, state=state, reason="", cpus=16, alloc_cpus=alloc_cpus, mem_mb=65536, alloc_mem_mb=0,
        gpus=4, alloc_gpus=0, gpu_type="sim", partitions=["gpu"],
    )  # fmt: skip


NODES = NodesReply(
    nodes=[node("gpu01"), node("gpu02"), node("gpu03", "mixed", 8), node("gpu04", "down")],
    partitions=[
        PartitionInfo(name="gpu", default=True, max_time_s=86400, default_time_s=3600,
                      nodes=["gpu01", "gpu02", "gpu03", "gpu04"]),
        PartitionInfo(name="debug", default=False, max_time_s=None, default_time_s=None, nodes=["gpu01"]),
        PartitionInfo(name="empty", default=False, max_time_s=1800, default_time_s=None, nodes=[]),
    ],
)  # fmt: skip


def sinfo_lines(fmt: str | None = None, long: bool = False, **options: Any) -> list[str]:
    layout = sinfo.parse_format(fmt, options.get("node_oriented", False), long)
    return sinfo.render_sinfo(NODES, layout, **options)


def test_sinfo_default_groups_by_partition_and_state() -> None:
    assert sinfo_lines() == [
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST",
        "gpu*         up 1-00:00:00      2   idle gpu[01-02]",
        "gpu*         up 1-00:00:00      1    mix gpu03",
        "gpu*         up 1-00:00:00      1  down* gpu04",
        "debug        up   infinite      1   idle gpu01",
        "empty        up      30:00      0    n/a ",
    ]


def test_sinfo_cpus_and_gres_sum_over_the_partition() -> None:
    assert sinfo_lines("%P %C %G %D", partitions=["gpu", "debug"]) == [
        "PARTITION CPUS(A/I/O/T) GRES NODES",
        "gpu* 8/40/16/64 gpu:sim:4 4",
        "debug 0/16/0/16 gpu:sim:4 1",
    ]


def test_sinfo_node_oriented() -> None:
    assert sinfo_lines(node_oriented=True, header=False, partitions=["gpu"]) == [
        "gpu01         1 gpu*      idle  ",
        "gpu02         1 gpu*      idle  ",
        "gpu03         1 gpu*      mix   ",
        "gpu04         1 gpu*      down* ",
    ]


def test_sinfo_long_states() -> None:
    nodes = [node("n1", "drained", 4), node("n2", "drained"), node("n3", "allocated", 16)]
    only = PartitionInfo(
        name="p", default=False, max_time_s=None, default_time_s=None, nodes=["n1", "n2", "n3"]
    )
    draining = NodesReply(nodes=nodes, partitions=[only])
    layout = sinfo.parse_format("%T %t %N", False)
    assert sinfo.render_sinfo(draining, layout, header=False) == [
        "draining drng n1",
        "drained drain n2",
        "allocated alloc n3",
    ]


def test_sinfo_long_as_slurm_22_05_prints_it() -> None:
    assert sinfo_lines(None, node_oriented=False, long=True) == [
        "PARTITION AVAIL  TIMELIMIT   JOB_SIZE ROOT OVERSUBS     GROUPS  NODES       STATE NODELIST",
        "gpu*         up 1-00:00:00 1-infinite   no       NO        all      2        idle gpu[01-02]",
        "gpu*         up 1-00:00:00 1-infinite   no       NO        all      1       mixed gpu03",
        "gpu*         up 1-00:00:00 1-infinite   no       NO        all      1       down* gpu04",
        "debug        up   infinite 1-infinite   no       NO        all      1        idle gpu01",
        "empty        up      30:00 1-infinite   no       NO        all      0         n/a ",
    ]
    # (REASON is %20E: padded to 20, as Slurm pads it)
    assert [line.rstrip() for line in sinfo_lines(None, node_oriented=True, long=True)[:2]] == [
        "NODELIST  NODES PARTITION       STATE CPUS    S:C:T MEMORY TMP_DISK WEIGHT AVAIL_FE REASON",
        "gpu01         1 gpu*             idle   16   16:1:1  65536        0      1   (null) none",
    ]


def test_sinfo_refuses_later_fields() -> None:
    with pytest.raises(CliError, match="--format field %e is not supported by Corral yet"):
        sinfo.parse_format("%P %e", False)


# --- scancel --------------------------------------------------------------------------------------


def test_scancel_ids_and_options_in_any_order() -> None:
    args = scancel.parse_args(["12", "--signal=KILL", "13", "-s", "SIGINT"])
    assert (args.job_ids, args.signal, args.filtered, args.signals) == ([12, 13], 2, False, True)


def test_scancel_filters_default_to_the_callers_jobs() -> None:
    request = scancel.jobs_request(scancel.parse_args(["-t", "PD", "-p", "gpu"]), "alice")
    assert (request.users, request.states, request.partitions) == (["alice"], ["PENDING"], ["gpu"])
    with_ids = scancel.jobs_request(scancel.parse_args(["5", "-t", "R"]), "alice")
    assert (with_ids.job_ids, with_ids.users) == ([5], [])
    args = scancel.parse_args(["--me", "-n", "train"])
    assert scancel.select_refs([job(), job(job_id=43, name="eval")], args) == [JobRef(42)]


def test_scancel_failure_lines() -> None:
    reply = CancelReply(
        outcomes=[CancelOutcome(job_id=5), CancelOutcome(job_id=99, error="Invalid job id specified")]
    )
    assert scancel.failure_lines(reply) == [
        "scancel: error: Kill job error on job id 99: Invalid job id specified"
    ]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "No job identification provided"),
        (["abc"], "Invalid job id abc"),
        (["7_[3-1]"], "Invalid job id 7_[3-1]: a range N-M needs 0 <= N <= M"),
        (["-s", "BOGUS", "5"], "Invalid job signal: BOGUS"),
        (["-R", "maint"], "option --reservation is not supported by Corral yet"),
    ],
    ids=["nothing", "not a number", "bad array range", "bad signal", "unsupported"],
)
def test_scancel_refusals(argv: list[str], message: str) -> None:
    with pytest.raises(CliError) as info:
        scancel.parse_args(argv)
    assert info.value.message == message


def test_squeue_qos_and_nice() -> None:
    rows = [job(qos="high", nice=10), pending(), job(qos="")]
    assert squeue_lines(["-o", "%q|%y"], rows) == ["QOS|NICE", "high|10", "normal|0", "normal|0"]
    assert squeue_lines(["-h", "-O", "qos,nice"], [job(qos="high", nice=-5)])[0].split() == ["high", "-5"]


def test_sacct_shows_a_pending_array_as_one_line_until_its_tasks_start() -> None:
    # Slurm's sacct: one record N_[0-3] for the tasks that never started; a started task is a row of its own.
    def task(index: int, **fields: Any) -> AcctJob:
        pending = {"state": "PENDING", "start_time": None, "end_time": None, "node_list": "", "steps": []}
        ids = {"job_id": 20 + index, "array_job_id": 20, "array_task_id": index}
        return acct_job(**(ids | pending | fields))

    assert sacct_lines(["-P", "-n", "-o", "JobID,State"], [task(i) for i in range(4)]) == ["20_[0-3]|PENDING"]
    started = task(0, state="RUNNING", start_time=T0 + 10, node_list="gpu01")
    rows = [started, task(1), task(2), task(3)]
    assert sacct_lines(["-P", "-n", "-X", "-o", "JobID,State"], rows) == ["20_0|RUNNING", "20_[1-3]|PENDING"]
    assert sacct_lines(["-P", "-n", "-o", "JobID"], [task(3), task(5, job_id=90)]) == ["20_[3,5]"]
    assert sacct_lines(["-P", "-n", "--array", "-o", "JobID"], [task(3), task(5)]) == ["20_3", "20_5"]


def squeue_sorted(argv: list[str], jobs: list[JobInfo], sort_env: str | None = None) -> list[str]:
    args = squeue.parse_args(["-h", "-o", "%i %t", *argv], sort_env)
    return squeue_lines(["-h", "-o", "%i %t"], squeue_sort.sort_jobs(jobs, args.sort, T0 + 13))


def test_squeue_default_order_is_slurms_partition_state_then_priority() -> None:
    # Slurm's P,t,-p: compact state as a string, so pending before running, and CA CD F R with -t all.
    jobs = [
        job(job_id=1, priority=5),
        pending(job_id=2, priority=1),
        pending(job_id=3, priority=9),
        job(job_id=4, state="FAILED", end_time=T0 + 12),
        job(job_id=5, state="CANCELLED", end_time=T0 + 12),
        job(job_id=6, state="COMPLETED", end_time=T0 + 12),
        job(job_id=7, partition="cpu", priority=1),
    ]
    assert squeue_sorted([], jobs) == ["7 R", "5 CA", "6 CD", "4 F", "3 PD", "2 PD", "1 R"]
    assert squeue_sorted(["-S", "i"], jobs) == [
        f"{i} {s}" for i, s in enumerate(["R", "PD", "PD", "F", "CA", "CD", "R"], 1)
    ]
    assert squeue_sorted(["--sort=-i"], jobs)[0] == "7 R"
    by_priority = ["4 F", "5 CA", "6 CD", "3 PD", "1 R", "2 PD", "7 R"]  # 100 100 100 9 5 1 1, then by id
    assert squeue_sorted(["-S", "-p,i"], jobs) == by_priority
    assert squeue_sorted([], jobs, sort_env="i")[0] == "1 R"  # SQUEUE_SORT, unless -S
    assert squeue_sorted(["-S", "-i"], jobs, sort_env="i")[0] == "7 R"


def test_squeue_refuses_an_unknown_sort_key() -> None:
    with pytest.raises(CliError, match="Invalid sort specification: z"):
        squeue.parse_args(["-S", "P,z"])
