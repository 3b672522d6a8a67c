"""Issue 11's accounting: every attempt, node capacity from the fold, TRES fields, sacct -D and sreport.

Pure: the projector and converters on hand-made logs, the report sums on hand-made rows, the commands'
rendering at a fixed clock in UTC.
"""

from __future__ import annotations

from datetime import UTC
from typing import Any

import msgspec
import pytest

from corral.cli import sacct, sreport
from corral.cli.errors import CliError
from corral.cli.sreport_render import Layout, usage_text
from corral.libs.slurm.tres import gres_string, tres_string
from corral.schemas import events as ev
from corral.schemas.api import (
    AcctAttempt,
    AcctJob,
    AcctStep,
    ReportReply,
    ReportRequest,
    TresCapacity,
    TresUsage,
)
from corral.services.accounting.folded import Projector
from corral.services.accounting.projection import NodeChange, RequeueJob, convert
from corral.services.accounting.report import Period, Run, overlap, summarise
from corral.services.accounting.report_tree import account_rows

pytestmark = pytest.mark.unit

#: 2023-11-14T22:13:20 UTC.
T0 = 1_700_000_000.0


def envelope(body: ev.Event, at: float) -> ev.Envelope:
    return ev.Envelope(meta=ev.Meta(event_id=f"id-{at}", occurred_at=at, actor="test"), body=body)


def registered(node: str = "gpu01", gpus: int = 4, drain: str = "") -> ev.NodeRegistered:
    return ev.NodeRegistered(node=ev.NodeName(node), cpus=16, mem_mb=65536, gpus=gpus, drain_reason=drain)


# --- the projection ---------------------------------------------------------------------------------


def node_changes(*bodies: ev.Event) -> list[tuple[int, str, int, bool]]:
    projector = Projector("gpu")
    entries = [(seq, envelope(body, T0 + seq)) for seq, body in enumerate(bodies, start=1)]
    return [
        (op.seq, op.node, op.gpus, op.available)
        for op in projector.operations(entries)
        if isinstance(op, NodeChange)
    ]


def test_node_capacity_follows_the_fold() -> None:
    down = ev.NodeDown(node=ev.NodeName("gpu01"), reason="Not responding")
    up = ev.NodeUp(node=ev.NodeName("gpu01"))
    drained = ev.NodeDrained(node=ev.NodeName("gpu01"), reason="fan", by="root")
    resumed = ev.NodeResumed(node=ev.NodeName("gpu01"), by="root")
    assert node_changes(registered(), down, down, up, registered(), drained, resumed, registered(gpus=8)) == [
        (1, "gpu01", 4, True),
        (2, "gpu01", 4, False),  # the second NodeDown changes nothing
        (4, "gpu01", 4, True),  # a re-registration with the same inventory changes nothing
        (6, "gpu01", 4, False),
        (7, "gpu01", 4, True),
        (8, "gpu01", 8, True),
    ]


def test_a_node_registered_drained_is_unavailable_and_an_unknown_node_is_nothing() -> None:
    assert node_changes(registered(drain="gpu count mismatch")) == [(1, "gpu01", 4, False)]
    assert node_changes(ev.NodeDown(node=ev.NodeName("ghost"), reason="x")) == []


@pytest.mark.parametrize(
    ("reason", "state"),
    [("NodeFail", "NODE_FAIL"), ("Preempted", "PREEMPTED"), ("Requested", "REQUEUED")],
    ids=["node-fail", "preempted", "scontrol-requeue"],
)
def test_a_requeued_attempt_ends_in_slurms_state_for_the_reason(reason: Any, state: str) -> None:
    body = ev.JobRequeued(job_id=ev.JobId(7), attempt=0, reason=reason)
    (op,) = convert([(3, envelope(body, T0))])
    assert isinstance(op, RequeueJob) and op.attempt_state == state


def test_submission_and_allocation_carry_what_tres_need() -> None:
    spec = ev.JobSpec(
        name="t",
        script="#!/bin/sh\n",
        workdir="/w",
        nodes=2,
        gpus_per_node=2,
        gpu_type="h100",
        mem_per_node_mb=8192,
    )
    alloc = [ev.NodeAllocation(node=ev.NodeName(n), gpus=[0, 1], cpus=4, mem_mb=8192) for n in ("a1", "a2")]
    submit = ev.JobSubmitted(job_id=ev.JobId(7), user="u", spec=spec)
    allocate = ev.JobAllocated(
        job_id=ev.JobId(7), attempt=0, partition="p", allocations=alloc, time_limit_s=None
    )
    ops = convert([(1, envelope(submit, T0)), (2, envelope(allocate, T0))])
    insert, start = ops
    assert (insert.mem_mb, insert.gpu_type, insert.num_gpus) == (16384, "h100", 4)  # type: ignore[union-attr]
    assert (start.mem_mb, start.num_gpus, start.num_cpus) == (16384, 4, 8)  # type: ignore[union-attr]


# --- TRES strings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"cpus": 8, "gpus": 2, "mem_mb": 16384, "nodes": 1}, "billing=8,cpu=8,gres/gpu=2,mem=16G,node=1"),
        (
            {"cpus": 4, "gpus": 2, "gpu_type": "h100", "nodes": 2},
            "billing=4,cpu=4,gres/gpu:h100=2,gres/gpu=2,node=2",
        ),
        ({"cpus": 2, "mem_mb": 3584, "nodes": 1}, "billing=2,cpu=2,mem=3584M,node=1"),
        ({"cpus": 2, "gpus": 1, "nodes": 1, "billing": False}, "cpu=2,gres/gpu=1,node=1"),
        ({"cpus": 0, "nodes": 0}, ""),
    ],
    ids=["gpus", "typed", "odd-memory", "step", "nothing"],
)
def test_tres_string(fields: dict[str, Any], text: str) -> None:
    assert tres_string(**fields) == text


def test_gres_string() -> None:
    assert (gres_string(2), gres_string(2, "h100"), gres_string(0)) == ("gpu:2", "gpu:h100:2", "")


# --- sacct ------------------------------------------------------------------------------------------------


def attempt(n: int, state: str, start: float, end: float, nodes: str) -> AcctAttempt:
    return AcctAttempt(
        attempt=n, state=state, partition="gpu", start_time=T0 + start, end_time=T0 + end, node_list=nodes,
        num_nodes=1, num_cpus=4, num_gpus=2, mem_mb=8192, exit_code=0, signal=0, reason="NodeFail",
    )  # fmt: skip


def requeued_job(**fields: Any) -> AcctJob:
    """Job 9: two GPUs, requeued once after its node failed, then completed on gpu02."""
    batch = AcctStep(
        step="batch", name="batch", state="COMPLETED", exit_code=0, signal=0, start_time=T0 + 40,
        end_time=T0 + 100, node_list="gpu02", num_cpus=4, num_tasks=1, num_gpus=2,
    )  # fmt: skip
    values: dict[str, Any] = {
        "job_id": 9, "name": "train", "user": "alice", "account": "proj", "partition": "gpu",
        "state": "COMPLETED", "cancelled_by": None, "exit_code": 0, "signal": 0, "submit_time": T0,
        "start_time": T0 + 40, "end_time": T0 + 100, "time_limit_s": 600, "num_nodes": 1, "num_cpus": 4,
        "num_gpus": 2, "node_list": "gpu02", "restart_count": 1, "workdir": "/w", "reason": "None",
        "steps": [batch], "req_nodes": 1, "req_cpus": 4, "req_gpus": 2, "req_mem_mb": 8192,
        "alloc_mem_mb": 8192, "attempts": [attempt(0, "NODE_FAIL", 10, 30, "gpu01")],
    }  # fmt: skip
    return AcctJob(**(values | fields))


def sacct_lines(argv: list[str], jobs: list[AcctJob]) -> list[str]:
    args = sacct.parse_args(argv)
    return sacct.render_acct(
        jobs, args.columns, header=args.header, parsable=args.parsable, steps=args.steps, now=T0 + 200, tz=UTC
    )


def test_sacct_duplicates_shows_every_attempt_as_slurm() -> None:
    argv = ["-D", "-P", "-o", "JobID,State,Start,End,NodeList,ElapsedRaw,AllocTRES,AllocGRES,ReqGRES"]
    args = sacct.parse_args(argv)
    assert sacct.acct_request(args, "alice", T0).duplicates
    assert sacct_lines(argv, [requeued_job()]) == [
        "JobID|State|Start|End|NodeList|ElapsedRaw|AllocTRES|AllocGRES|ReqGRES",
        "9|NODE_FAIL|2023-11-14T22:13:30|2023-11-14T22:13:50|gpu01|20|billing=4,cpu=4,gres/gpu=2,mem=8G,node=1|gpu:2|gpu:2",
        "9|COMPLETED|2023-11-14T22:14:00|2023-11-14T22:15:00|gpu02|60|billing=4,cpu=4,gres/gpu=2,mem=8G,node=1|gpu:2|gpu:2",
        "9.batch|COMPLETED|2023-11-14T22:14:00|2023-11-14T22:15:00|gpu02|60|cpu=4,gres/gpu=2,node=1|gpu:2|",
    ]  # fmt: skip
    # Without -D the request asks for no earlier runs (the reply then carries none).
    assert not sacct.acct_request(sacct.parse_args(["-X"]), "alice", T0).duplicates


def test_sacct_duplicates_shows_each_attempts_steps_under_that_attempt() -> None:
    def step(name: str, state: str, start: float, end: float, nodes: str) -> AcctStep:
        return AcctStep(
            step=name, name=name, state=state, exit_code=0, signal=0, start_time=T0 + start,
            end_time=T0 + end, node_list=nodes, num_cpus=4, num_tasks=1, num_gpus=2,
        )  # fmt: skip

    first = attempt(0, "NODE_FAIL", 10, 30, "gpu01")
    first = msgspec.structs.replace(
        first, steps=[step("batch", "REQUEUED", 10, 30, "gpu01"), step("0", "COMPLETED", 12, 20, "gpu01")]
    )
    argv = ["-D", "-P", "-n", "-o", "JobID,State,NodeList"]
    assert sacct_lines(argv, [requeued_job(attempts=[first])]) == [
        "9|NODE_FAIL|gpu01",
        "9.batch|REQUEUED|gpu01",
        "9.0|COMPLETED|gpu01",
        "9|COMPLETED|gpu02",
        "9.batch|COMPLETED|gpu02",
    ]
    # -X: the attempts' records without their steps.
    assert sacct_lines(["-X", *argv], [requeued_job(attempts=[first])]) == [
        "9|NODE_FAIL|gpu01",
        "9|COMPLETED|gpu02",
    ]


def test_sacct_req_tres_cpu_time_and_unknown_usage() -> None:
    argv = ["-X", "-P", "-n", "-o", "ReqTRES,CPUTimeRAW,CPUTime,TRESUsageInTot"]
    job = requeued_job(attempts=[], req_mem_mb=None, gpu_type="h100")
    assert sacct_lines(argv, [job]) == ["billing=4,cpu=4,gres/gpu:h100=2,gres/gpu=2,node=1|240|00:04:00|"]
    pending = requeued_job(attempts=[], start_time=None, end_time=None, state="PENDING", steps=[])
    assert sacct_lines(["-X", "-P", "-n", "-o", "AllocTRES,AllocGRES,CPUTimeRAW"], [pending]) == ["||0"]


# --- sreport sums -----------------------------------------------------------------------------------------


def test_overlap_clips_to_the_window_and_to_now() -> None:
    window = (T0, T0 + 100)
    assert overlap(T0 - 50, T0 + 30, window, now=T0 + 1000) == 30
    assert overlap(T0 + 90, None, window, now=T0 + 95) == 5
    assert overlap(T0 + 200, T0 + 300, window, now=T0 + 1000) == 0
    assert overlap(T0 + 10.2, T0 + 20.9, window, now=T0 + 1000) == 10  # whole seconds, as sacct's ElapsedRaw


def test_summarise_sums_clipped_runs_and_node_periods() -> None:
    runs = [
        Run(account="ml", user="alice", start=T0 - 10, end=T0 + 20, cpus=4, gpus=2),
        Run(account="ml", user="bob", start=T0 + 50, end=None, cpus=8, gpus=1),
        Run(account="cv", user="alice", start=T0 + 10, end=T0 + 40, cpus=2, gpus=0),
    ]
    periods = [
        Period(start=T0 - 100, end=T0 + 60, cpus=16, gpus=4, available=True),
        Period(start=T0 + 60, end=None, cpus=16, gpus=4, available=False),
    ]
    req = ReportRequest(start=T0, end=T0 + 100, tres=["gres/gpu", "cpu"])
    reply = summarise(req, runs, periods, now=T0 + 80, cluster="c")
    assert reply.capacity == [
        TresCapacity(tres="gres/gpu", allocated=2 * 20 + 1 * 30, down=4 * 20, reported=4 * 80),
        TresCapacity(tres="cpu", allocated=4 * 20 + 8 * 30 + 2 * 30, down=16 * 20, reported=16 * 80),
    ]
    assert [(u.tres, u.account, u.user, u.seconds) for u in reply.usage] == [
        ("gres/gpu", "cv", "alice", 0),
        ("gres/gpu", "ml", "alice", 40),
        ("gres/gpu", "ml", "bob", 30),
        ("cpu", "cv", "alice", 60),
        ("cpu", "ml", "alice", 80),
        ("cpu", "ml", "bob", 240),
    ]
    only_bob = summarise(ReportRequest(start=T0, end=T0 + 100, users=["bob"]), runs, periods, now=T0 + 80)
    assert [u.user for u in only_bob.usage] == ["bob"]
    assert only_bob.capacity[0].allocated == 380  # the cluster's allocation counts every run


# --- sreport rendering ------------------------------------------------------------------------------------


REPLY = ReportReply(
    cluster="corral",
    start=T0,
    end=T0 + 3600,
    capacity=[TresCapacity(tres="gres/gpu", allocated=7200, down=3600, reported=28800)],
    usage=[
        TresUsage(tres="gres/gpu", account="ml", user="alice", seconds=5400),
        TresUsage(tres="gres/gpu", account="ml", user="bob", seconds=1800),
    ],
    accounts=account_rows({("ml", "alice"): [5400], ("ml", "bob"): [1800]}, {}),
)


def lines(argv: list[str], reply: ReportReply = REPLY) -> list[str]:
    return sreport.render(sreport.parse_args(argv), reply)


def test_cluster_utilization_fixed_width_as_slurm() -> None:
    out = lines(["-t", "hours", "--tres=gres/gpu", "cluster", "utilization"])
    assert out[:4] == [
        "-" * 80,
        f"Cluster Utilization {_local(T0)} - {_local(T0 + 3599)}",
        "Usage reported in TRES Hours",
        "-" * 80,
    ]
    assert out[4:] == [
        "  Cluster      TRES Name    Allocated       Down  PLND Down         Idle   Planned     Reported ",
        "--------- -------------- ------------ ---------- ---------- ------------ --------- ------------ ",
        "   corral       gres/gpu            2          1          0            5         0            8 ",
    ]


def _local(at: float) -> str:
    from corral.libs.slurm.timefmt import format_timestamp

    return format_timestamp(at)


def test_account_utilization_by_user_parsable_in_seconds_and_percent() -> None:
    argv = ["-P", "-n", "-t", "seconds", "-T", "gres/gpu", "cluster", "AccountUtilizationByUser"]
    assert lines(argv) == [
        "corral|root|||gres/gpu|7200",
        "corral|ml|||gres/gpu|7200",
        "corral|ml|alice||gres/gpu|5400",
        "corral|ml|bob||gres/gpu|1800",
    ]
    assert lines(["-p", "-t", "percent", "cluster", "accountutil"])[4:6] == [
        "Cluster|Account|Login|Proper Name|Used|Energy|",
        "corral|root|||25.00%|0.00%|",
    ]


def test_top_usage_ranks_users_and_defaults_to_minutes() -> None:
    out = lines(["user", "topusage", "TopCount=1"])
    assert out[1] == f"Top 1 Users {_local(T0)} - {_local(T0 + 3599)} (3600 secs)"
    assert out[2] == "Usage reported in TRES Minutes"  # the reply is about GPUs
    assert out[4:] == [
        "  Cluster     Login     Proper Name         Account       Used     Energy ",
        "--------- --------- --------------- --------------- ---------- ---------- ",
        "   corral     alice                              ml         90          0 ",
    ]


@pytest.mark.parametrize(
    ("seconds", "fmt", "text"),
    [(5399, "hours", "1"), (119, "minutes", "1"), (90, "seconds", "90"), (90, "secper", "90(1.04%)")],
    ids=["hours-cut", "minutes-cut", "seconds", "secper"],
)
def test_usage_units(seconds: float, fmt: Any, text: str) -> None:
    assert usage_text(seconds, 8640, fmt) == text


def test_report_request_window_and_tres() -> None:
    args = sreport.parse_args(["--tres=gres/gpu,cpu", "cluster", "utilization"])
    midnight = 1_699_920_000.0  # 2023-11-14T00:00:00 UTC
    req = sreport.report_request(args, T0, UTC)
    assert (req.start, req.end, req.tres) == (midnight - 86400, midnight, ["gres/gpu", "cpu"])
    args = sreport.parse_args(["user", "top", "start=2023-11-01", "end=11/02/23", "users=alice"])
    req = sreport.report_request(args, T0, UTC)
    assert (req.end - req.start, req.users) == (86400, ["alice"])
    assert sreport.parse_args(["CLUSTER", "Ut"]).report == ("cluster", "utilization")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["cluster"], "name a report"),
        (["cluster", "nonsense"], 'unknown report "cluster nonsense"'),
        (["-t", "days", "cluster", "utilization"], 'invalid -t "days"'),
        (["--tres=mem", "cluster", "utilization"], 'invalid --tres "mem"'),
        (["cluster", "utilization", "colour=red"], 'unknown condition "colour=red"'),
        (["user", "topusage", "TopCount=x"], 'invalid TopCount "x"'),
        (["-M", "x", "cluster", "utilization"], "option --cluster is not supported by Corral yet"),
    ],
    ids=["no-report", "unknown-report", "time-format", "tres", "condition", "top-count", "unsupported"],
)
def test_sreport_refusals(argv: list[str], message: str) -> None:
    with pytest.raises(CliError) as info:
        sreport.parse_args(argv)
    assert info.value.message.startswith(message)


def test_an_end_before_the_start_is_refused() -> None:
    args = sreport.parse_args(["cluster", "utilization", "start=2023-11-02", "end=2023-11-01"])
    with pytest.raises(CliError, match="must be after its start"):
        sreport.report_request(args, T0, UTC)


def test_layout_default_is_minutes_without_tres_column() -> None:
    assert sreport.parse_args(["cluster", "utilization"]).layout == Layout()
