"""scancel: which command lines cancel and which signal, and the filters applied on the client side."""

from __future__ import annotations

import pytest

from corral.cli import scancel
from corral.cli.jobrefs import JobRef
from corral.schemas.api import JobInfo

pytestmark = pytest.mark.unit


def info(job_id: int, **fields: object) -> JobInfo:
    """A running job of alice's on gpu[01-02]."""
    base: dict[str, object] = dict(
        job_id=job_id, name="train", user="alice", account="ml", partition="gpu", state="RUNNING",
        reason="None", submit_time=0.0, start_time=1.0, end_time=None, time_limit_s=None, num_nodes=2,
        num_cpus=2, num_tasks=2, gpus_per_node=0, gpu_type=None, min_memory_mb=None,
        node_list="gpu[01-02]", restart_count=0, priority=1, workdir="/tmp", qos="normal",
    )  # fmt: skip
    base.update(fields)
    return JobInfo(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("argv", "signals", "signal", "scope"),
    [
        (["5"], False, None, "steps"),
        (["-s", "KILL", "5"], False, 9, "steps"),
        (["-s", "USR1", "5"], True, 10, "steps"),
        (["5", "--signal=SIGTERM"], True, 15, "steps"),
        (["-s", "12", "5"], True, 12, "steps"),
        (["-b", "-s", "USR2", "5"], True, 12, "batch"),
        (["-f", "-s", "KILL", "5"], True, 9, "full"),
        (["--batch", "5"], True, None, "batch"),
    ],
    ids=[
        "cancel",
        "kill-cancels",
        "usr1",
        "term-after-id",
        "number",
        "batch",
        "full-kill",
        "batch-no-signal",
    ],
)
def test_scancel_cancels_or_signals(argv: list[str], signals: bool, signal: int | None, scope: str) -> None:
    args = scancel.parse_args(argv)
    assert (args.signals, args.signal, args.scope) == (signals, signal, scope)
    if signals:
        request = scancel.signal_request(args.jobs, args)
        assert (request.job_ids, request.signal, request.scope) == ([5], signal or 9, scope)


def test_scancel_signal_filters_select_running_jobs_only() -> None:
    args = scancel.parse_args(["-s", "USR1", "-u", "alice"])
    assert scancel.jobs_request(args, "alice").states == ["RUNNING"]
    assert scancel.jobs_request(scancel.parse_args(["-u", "alice"]), "alice").states == []


@pytest.mark.parametrize(
    ("argv", "selected"),
    [
        (["-w", "gpu02"], [1]),
        (["-w", "gpu[03-04]"], [2]),
        (["-q", "high"], [2]),
        (["-t", "PD"], [3]),
        (["-q", "normal", "-w", "gpu01"], [1]),
    ],
    ids=["node", "node-range", "qos", "state", "qos-and-node"],
)
def test_scancel_client_side_filters(argv: list[str], selected: list[int]) -> None:
    jobs = [
        info(1),
        info(2, qos="high", node_list="gpu04"),
        info(3, state="PENDING", node_list=""),
    ]
    args = scancel.parse_args(["--me", *argv])
    assert scancel.select_refs(jobs, args) == [JobRef(j) for j in selected]


def test_scancel_bad_nodelist() -> None:
    with pytest.raises(scancel.CliError, match="invalid --nodelist"):
        scancel.parse_args(["-w", "gpu[02-01]"])


def task(job_id: int, array: int, index: int, **fields: object) -> JobInfo:
    return info(job_id, array_job_id=array, array_task_id=index, state="PENDING", **fields)


def test_scancel_u_cancels_an_array_whose_every_task_it_selected_as_the_array() -> None:
    # Arrays 10 (tasks 10-12) and 20 (tasks 20-21, of two names), and job 30.
    jobs = [
        task(10, 10, 0),
        task(11, 10, 1),
        task(12, 10, 2),
        task(20, 20, 0, name="a"),
        task(21, 20, 1, name="b"),
        info(30),
    ]
    args = scancel.parse_args(["-u", "alice"])
    refs = scancel.select_refs(jobs, args)
    assert scancel.whole_arrays(refs, jobs, args) == [JobRef(10), JobRef(20), JobRef(30)]
    # Some tasks of array 20 only: those tasks.
    by_name = scancel.parse_args(["-u", "alice", "-n", "a"])
    assert scancel.whole_arrays(scancel.select_refs(jobs, by_name), jobs, by_name) == [JobRef(20, (0,))]
    # The reply then does not hold every live task: each task named, as before.
    for argv in (["-u", "alice", "-t", "PENDING"], ["-u", "alice", "-p", "gpu"], ["-u", "alice", "11"]):
        args = scancel.parse_args(argv)
        refs = scancel.select_refs(jobs, args)
        assert scancel.whole_arrays(refs, jobs, args) == refs
    signalled = scancel.parse_args(["-u", "alice", "-s", "USR1"])
    assert scancel.whole_arrays(scancel.select_refs(jobs, signalled), jobs, signalled) == scancel.select_refs(
        jobs, signalled
    )
