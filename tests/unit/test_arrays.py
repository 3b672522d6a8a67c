"""Job arrays: ``--array`` specs, expansion in the fold, the ``%P`` throttle, dependencies on arrays, the
tasks' environment and output files, and how the commands name tasks (``A_T``, ``A_[x-y%P]``)."""

from __future__ import annotations

from datetime import UTC
from typing import Any, cast

import pytest
from builders import Log, allocated, cluster, env, exited, job, policy, submitted

from corral.cli import sacct, squeue
from corral.cli.errors import CliError
from corral.cli.jobrefs import JobRef, parse_job_refs, split_job_list
from corral.cli.scancel import cancel_request
from corral.cli.scontrol_show_job import show_job
from corral.libs.core.eligibility import dependency_status
from corral.libs.core.fold import fold
from corral.libs.core.orders import orders
from corral.libs.core.plan import Plan, plan
from corral.libs.core.state import State, array_tasks, encode_state
from corral.libs.runtime.bus import Bus, LogEntry
from corral.libs.runtime.errors import InvalidInput
from corral.libs.slurm.array import (
    MAX_ARRAY_SIZE,
    array_indices,
    format_indices,
    format_spec,
    index_step,
    parse_array,
    parse_indices,
)
from corral.libs.slurm.dependency import parse_dependency
from corral.libs.slurm.errors import FormatError
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.agent.jobenv import job_environment, output_paths
from corral.services.gateway.lookup import PROBE_CHUNK, JobLookup
from corral.services.gateway.validate import array_size
from corral.services.scheduler import views
from corral.services.scheduler.views import job_info, jobs_reply

pytestmark = pytest.mark.unit

POLICY = policy()
T0 = 1_700_000_000.0

# --- the --array spec ---------------------------------------------------------------------------

PARSE_CASES: list[tuple[str, list[int], int]] = [
    ("0-5%2", [0, 1, 2, 3, 4, 5], 2),
    ("1-7:2", [1, 3, 5, 7], 0),
    ("1,3,5-9", [1, 3, 5, 6, 7, 8, 9], 0),
    ("0-15:4", [0, 4, 8, 12], 0),
    ("4", [4], 0),
    ("3,1,1,2", [1, 2, 3], 0),  # duplicates merge, indices ascend
    ("0-999%32", list(range(1000)), 32),
    ("0-1000", list(range(1001)), 0),  # MaxArraySize=1001: 1001 tasks, the largest index 1000
    ("1000", [1000], 0),
    (" 2-3 ", [2, 3], 0),
]


@pytest.mark.parametrize(("text", "indices", "throttle"), PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_array_spec_forms(text: str, indices: list[int], throttle: int) -> None:
    spec = parse_array(text)
    assert (array_indices(spec), spec.throttle) == (indices, throttle)
    assert array_indices(parse_array(format_spec(spec))) == indices


BAD_SPECS = [
    ("0-1001", "array index 1001 is too large: indices go from 0 to 1000 (MaxArraySize=1001)"),
    ("5000", "array index 5000 is too large"),
    ("5-1", "a range N-M needs 0 <= N <= M"),
    ("1-7:0", "a range's :STEP must be at least 1"),
    ("0-15%0", "the %MAX_RUNNING limit must be a whole number of at least 1"),
    ("0-15%", "the %MAX_RUNNING limit"),
    ("0-15%x", "the %MAX_RUNNING limit"),
    ("", "use indices N, ranges N-M"),
    ("-1", "use indices N, ranges N-M"),
    ("1,,2", "use indices N, ranges N-M"),
    ("a-b", "use indices N, ranges N-M"),
    ("1-2-3", "use indices N, ranges N-M"),
    ("1:2", "use indices N, ranges N-M"),
    (",".join(["1"] * (MAX_ARRAY_SIZE + 1)), "at most 1001 items"),
]


@pytest.mark.parametrize(("text", "needle"), BAD_SPECS, ids=[c[0][:20] or "empty" for c in BAD_SPECS])
def test_bad_array_specs_are_refused_naming_the_fix(text: str, needle: str) -> None:
    with pytest.raises(FormatError) as info:
        parse_array(text)
    assert info.value.field == "--array"
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (ev.ArraySpec(ranges=[]), "an array has 1 to 1001 items"),
        (ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=10**12)]), "too large"),
        (ev.ArraySpec(ranges=[ev.ArrayRange(start=-3, end=2)]), "0 <= N <= M"),
        (ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=2, step=-1)]), ":STEP"),
        (ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=2)], throttle=-1), "%MAX_RUNNING"),
    ],
    ids=["no ranges", "huge", "negative", "negative step", "negative throttle"],
)
def test_out_of_bounds_specs_from_other_clients_are_refused_by_the_gateway(
    spec: ev.ArraySpec, needle: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        array_size(job(nodes=1, array=spec))
    assert info.value.field == "array"
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("indices", "text", "step"),
    [([0, 1, 2, 5, 7, 8], "0-2,5,7-8", 1), ([1, 3, 5, 7], "1,3,5,7", 2), ([4], "4", 1), ([], "", 1)],
    ids=["ranges", "stepped", "one", "none"],
)
def test_index_formatting_and_step(indices: list[int], text: str, step: int) -> None:
    assert (format_indices(indices), index_step(indices)) == (text, step)
    if indices:
        assert parse_indices(text) == indices


# --- the fold: one entry, N jobs ------------------------------------------------------------------


def array_job(text: str, **fields: Any) -> ev.JobSpec:
    """A one-node, one-GPU job array ``--array=text``."""
    fields.setdefault("gpus", 1)
    fields.setdefault("nodes", 1)
    return job(array=parse_array(text), **fields)


def test_one_submission_becomes_one_pending_job_per_index() -> None:
    log = Log(*cluster(nodes=1))
    state = log.add(submitted(10, array_job("1,3,5-7")))
    tasks = [(j.job_id, j.array_job_id, j.array_task_id, j.state) for j in state.jobs.values()]
    assert tasks == [
        (10, 10, 1, "PENDING"),
        (11, 10, 3, "PENDING"),
        (12, 10, 5, "PENDING"),
        (13, 10, 6, "PENDING"),
        (14, 10, 7, "PENDING"),
    ]
    assert list(state.active) == [10, 11, 12, 13, 14]
    # Only the first task's subject holds the entry: the others' optimistic concurrency starts at 0.
    assert [j.last_seq for j in state.jobs.values()] == [2, 0, 0, 0, 0]
    assert [t.job_id for t in array_tasks(state, 10)] == [10, 11, 12, 13, 14]
    assert array_tasks(state, 11) == []


def test_an_array_whose_ids_are_taken_is_not_accepted_at_all() -> None:
    log = Log(*cluster(nodes=1))
    state = log.add(submitted(12), submitted(10, array_job("0-4")))
    assert sorted(state.jobs) == [12]


def test_an_out_of_bounds_array_in_the_log_changes_nothing() -> None:
    bad = job(nodes=1, array=ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=5000)]))
    log = Log(*cluster(nodes=1))
    state = log.add(submitted(1, bad))
    assert (state.jobs, state.active, state.last_seq) == ({}, {}, 2)


def test_replaying_an_array_log_gives_the_same_state() -> None:
    log = Log(*cluster(nodes=2, gpus=2))
    log.add(submitted(1, array_job("0-5%2")))
    for _ in range(6):
        cycle(log)
        finish_running(log)
    assert encode_state(fold(log.entries)) == encode_state(log.state)


# --- the throttle ---------------------------------------------------------------------------------


def cycle(log: Log) -> Plan:
    """Plan at the log's time and append the decisions, as the live scheduler does."""
    out = plan(log.state, log.state.now, POLICY)
    log.add(*out.decisions)
    return out


def running(state: State) -> list[int]:
    return [j.job_id for j in state.jobs.values() if j.state == "RUNNING"]


def finish_running(log: Log) -> None:
    """Every running job's script exits 0 (the next cycle concludes them)."""
    for job_id in running(log.state):
        node = log.state.jobs[job_id].allocations[0].node
        log.add(exited(job_id, node))


@pytest.mark.parametrize(
    ("text", "gpus", "peak"),
    [("0-9%3", 8, 3), ("0-9%1", 8, 1), ("0-4", 8, 5), ("0-9%4", 2, 2)],
    ids=["throttle 3", "throttle 1", "no throttle", "resources below the throttle"],
)
def test_throttle_keeps_at_most_p_tasks_running_across_cycles(text: str, gpus: int, peak: int) -> None:
    log = Log(*cluster(nodes=1, gpus=gpus))
    log.add(submitted(1, array_job(text)))
    seen_peak, cycles = 0, 0
    while log.state.active and cycles < 30:
        out = cycle(log)
        now_running = running(log.state)
        seen_peak = max(seen_peak, len(now_running))
        throttled = [job_id for job_id, why in out.reasons.items() if why == "JobArrayTaskLimit"]
        if "%" in text and len(now_running) == parse_array(text).throttle:
            assert throttled == [j for j in log.state.active if j not in now_running]
        finish_running(log)
        cycles += 1
    assert seen_peak == peak
    assert not log.state.active
    assert {j.state for j in log.state.jobs.values()} == {"COMPLETED"}


def test_throttled_tasks_block_nothing_behind_them() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, array_job("0-3%1")), submitted(5, job(nodes=1, gpus=2)))
    out = cycle(log)
    assert [d.job_id for d in out.decisions if isinstance(d, ev.JobAllocated)] == [1, 5]
    assert out.reasons == {2: "JobArrayTaskLimit", 3: "JobArrayTaskLimit", 4: "JobArrayTaskLimit"}
    assert not out.starts.keys() & {2, 3, 4}


def test_a_task_concluded_in_the_cycle_frees_its_place_in_the_same_cycle() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, array_job("0-2%1")))
    cycle(log)
    log.add(exited(1, "gpu01"))
    out = cycle(log)
    assert [type(d).__name__ for d in out.decisions] == ["JobCompleted", "JobAllocated"]
    assert running(log.state) == [2]


def test_the_fold_refuses_an_allocation_beyond_the_throttle() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    state = log.add(
        submitted(1, array_job("0-2%2")), allocated(1, {"gpu01": [0]}), allocated(2, {"gpu01": [1]})
    )
    state = log.add(allocated(3, {"gpu01": [2]}))
    assert running(state) == [1, 2] and state.array_running == {1: 2}
    state = log.add(exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0), allocated(3, {"gpu01": [2]}))
    assert running(state) == [2, 3] and state.array_running == {1: 2}
    state = log.add(ev.JobRequeued(job_id=2, attempt=0, reason="NodeFail"))
    assert state.array_running == {1: 1}


# --- cancel and dependencies ----------------------------------------------------------------------


def test_cancelling_the_array_cancels_every_live_task() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, array_job("0-3%2")))
    cycle(log)
    log.add(exited(1, "gpu01"))
    cycle(log)  # task 0 completed, 1 and 2 run, 3 waits
    state = log.add(ev.JobCancelRequested(job_id=1, user="alice", whole_array=True))
    assert [j.cancel_by for j in state.jobs.values()] == [None, "alice", "alice", "alice"]
    assert state.jobs[3].last_seq < log.entries[-1][0]  # the entry is on task 0's subject only
    out = cycle(log)
    assert [(type(d).__name__, d.job_id) for d in out.decisions] == [("JobCancelled", 4)]
    kills = [(o.job_id, o.reason) for o in orders(log.state, POLICY) if isinstance(o, api.KillOrder)]
    assert kills == [(2, "cancel"), (3, "cancel")]


def test_cancelling_one_task_leaves_the_others() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    state = log.add(submitted(1, array_job("0-2")), ev.JobCancelRequested(job_id=1, user="alice"))
    assert [j.cancel_by for j in state.jobs.values()] == ["alice", None, None]


def completed_task(log: Log, job_id: int) -> None:
    log.add(
        allocated(job_id, {"gpu01": [0]}), exited(job_id, "gpu01"), ev.JobCompleted(job_id=job_id, attempt=0)
    )


def failed_task(log: Log, job_id: int) -> None:
    log.add(
        allocated(job_id, {"gpu01": [0]}),
        exited(job_id, "gpu01", exit_code=1),
        ev.JobFailed(job_id=job_id, attempt=0, reason="NonZeroExitCode", exit_code=1),
    )


def started_task(log: Log, job_id: int) -> None:
    log.add(allocated(job_id, {"gpu01": [0]}))


DEPENDENCY_CASES = [
    ("afterok", [completed_task, completed_task], "met"),
    ("afterok", [completed_task], "waiting"),
    ("afterok", [failed_task], "never"),
    ("afterany", [completed_task, failed_task], "met"),
    ("afterany", [completed_task, started_task], "waiting"),
    ("afternotok", [completed_task, failed_task], "met"),
    ("afternotok", [completed_task, completed_task], "never"),
    ("afternotok", [failed_task], "waiting"),
    ("after", [completed_task, started_task], "met"),
    ("after", [started_task], "waiting"),
]


@pytest.mark.parametrize(
    ("kind", "tasks", "status"),
    DEPENDENCY_CASES,
    ids=[f"{k}-{'-'.join(t.__name__.split('_')[0] for t in ts)}" for k, ts, _ in DEPENDENCY_CASES],
)
def test_a_dependency_on_an_array_id_is_about_every_task(kind: str, tasks: list[Any], status: str) -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    deps = parse_dependency(f"{kind}:1")
    log.add(submitted(1, array_job("0-1")), submitted(3, job(nodes=1, gpus=1, dependencies=deps)))
    for job_id, bring in enumerate(tasks, start=1):
        bring(log, job_id)
    assert dependency_status(log.state, log.state.jobs[3]) == status


def test_a_dependency_on_a_tasks_own_id_is_about_that_task_only() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    deps = parse_dependency("afterok:2")
    log.add(submitted(1, array_job("0-1")), submitted(3, job(nodes=1, gpus=1, dependencies=deps)))
    completed_task(log, 2)
    assert dependency_status(log.state, log.state.jobs[3]) == "met"


# --- the task's environment and files -------------------------------------------------------------


def task_order(text: str, job_id: int, array_job_id: int, index: int, **spec: Any) -> api.LaunchOrder:
    log = Log(*cluster(nodes=1))
    log.add(submitted(array_job_id, array_job(text, **spec)))
    log.add(allocated(job_id, {"gpu01": [3]}))
    launch = [o for o in orders(log.state, POLICY) if isinstance(o, api.LaunchOrder)]
    assert (launch[0].array_job_id, launch[0].array_task_id) == (array_job_id, index)
    return launch[0]


ENV_CASES = [
    ("0-5%2", 23, 20, 3, ("20", "3", "6", "0", "5", "1")),
    ("1-7:2", 31, 30, 3, ("30", "3", "4", "1", "7", "2")),
    ("1,3,5-9", 46, 40, 9, ("40", "9", "7", "1", "9", "1")),
    ("4", 50, 50, 4, ("50", "4", "1", "4", "4", "1")),
]
ARRAY_VARS = ("JOB_ID", "TASK_ID", "TASK_COUNT", "TASK_MIN", "TASK_MAX", "TASK_STEP")


@pytest.mark.parametrize(
    ("text", "job_id", "array_id", "index", "values"), ENV_CASES, ids=[c[0] for c in ENV_CASES]
)
def test_array_environment(
    text: str, job_id: int, array_id: int, index: int, values: tuple[str, ...]
) -> None:
    environment = job_environment(task_order(text, job_id, array_id, index), {}, 1000, 1000)
    assert tuple(environment[f"SLURM_ARRAY_{name}"] for name in ARRAY_VARS) == values
    assert environment["SLURM_JOB_ID"] == str(job_id)


def test_a_job_that_is_not_an_array_task_has_no_array_variables() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(nodes=1, gpus=1)), allocated(1, {"gpu01": [0]}))
    (launch,) = orders(log.state, POLICY)
    assert isinstance(launch, api.LaunchOrder)
    inherited = {"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_JOB_ID": "8"}  # a parent job's
    assert not [k for k in job_environment(launch, inherited, 1000, 1000) if k.startswith("SLURM_ARRAY_")]


@pytest.mark.parametrize(
    ("stdout", "stderr", "expected"),
    [
        (None, None, ("/home/alice/run/slurm-20_3.out", None)),
        (
            "logs/%x-%A_%a.out",
            "/tmp/%A.%a.%j.err",
            ("/home/alice/run/logs/train-20_3.out", "/tmp/20.3.23.err"),
        ),
        ("%j-%4a.out", None, ("/home/alice/run/23-0003.out", None)),
    ],
    ids=["default slurm-%A_%a.out", "%A %a %j", "padded %a"],
)
def test_output_patterns_of_a_task(
    stdout: str | None, stderr: str | None, expected: tuple[str, str | None]
) -> None:
    assert output_paths(task_order("0-5", 23, 20, 3, stdout=stdout, stderr=stderr)) == expected


# --- squeue, sacct, scontrol, scancel -------------------------------------------------------------


def infos(log: Log, out: Plan, **request: Any) -> list[api.JobInfo]:
    return jobs_reply(log.state, out, POLICY, api.JobsRequest(**request), log.state.now).jobs


def throttled_array() -> tuple[Log, Plan]:
    """Array 20 (0-5%2) after one cycle: tasks 0 and 1 run, 2-5 wait for the throttle; job 26 too."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(20, array_job("0-5%2")), submitted(26, job(nodes=1, gpus=1, name="solo")))
    out = cycle(log)
    return log, out


def test_squeue_shows_tasks_as_a_t_and_the_pending_remainder_aggregated() -> None:
    log, out = throttled_array()
    jobs = infos(log, out)
    args = squeue.parse_args(["-h", "-o", "%i %A %F %K %t %r"])
    rows, labels = squeue.aggregate_arrays(jobs)
    lines = squeue.render_jobs(rows, args.layout, header=False, now=log.state.now, tz=UTC, labels=labels)
    assert lines == [
        "20_0 20 20 0 R None",
        "20_1 21 20 1 R None",
        "20_[2-5%2] 22 20 2 PD JobArrayTaskLimit",
        "26 26 26 N/A R None",
    ]
    expanded = squeue.render_jobs(jobs, args.layout, header=False, now=log.state.now, tz=UTC)
    assert expanded[2:4] == ["20_2 22 20 2 PD JobArrayTaskLimit", "20_3 23 20 3 PD JobArrayTaskLimit"]


def test_squeue_j_selects_tasks() -> None:
    log, out = throttled_array()
    for argv, shown in [
        (["-j", "20"], [20, 21, 22, 23, 24, 25]),
        (["-j", "20_3"], [23]),
        (["-j", "20_[0,4-5],26"], [20, 24, 25, 26]),
        (["-j", "23"], [23]),
    ]:
        args = squeue.parse_args(argv)
        jobs = infos(log, out, job_ids=args.job_ids)
        assert [j.job_id for j in squeue.select_jobs(jobs, args)] == shown, argv


def test_job_info_carries_the_array() -> None:
    log, out = throttled_array()
    info = job_info(log.state.jobs[23], out, POLICY)
    assert (info.array_job_id, info.array_task_id, info.array_throttle, info.reason) == (
        20,
        3,
        2,
        "JobArrayTaskLimit",
    )
    lines = show_job(info, log.state.now, lambda user: None, UTC)
    assert lines[0] == "JobId=23 ArrayJobId=20 ArrayTaskId=3 ArrayTaskThrottle=2 JobName=train"
    assert "StdOut=/home/alice/run/slurm-20_3.out" in lines


def acct(job_id: int, task: int | None, array: int | None, **fields: Any) -> api.AcctJob:
    step = api.AcctStep(
        step="batch", name="batch", state="COMPLETED", exit_code=0, signal=0, start_time=T0, end_time=T0 + 5,
        node_list="gpu01", num_cpus=1, num_tasks=1, num_gpus=0,
    )  # fmt: skip
    values: dict[str, Any] = {
        "job_id": job_id, "name": "train", "user": "alice", "account": "proj", "partition": "gpu",
        "state": "COMPLETED", "cancelled_by": None, "exit_code": 0, "signal": 0, "submit_time": T0,
        "start_time": T0, "end_time": T0 + 5, "time_limit_s": 60, "num_nodes": 1, "num_cpus": 1,
        "num_gpus": 0, "node_list": "gpu01", "restart_count": 0, "workdir": "/w", "reason": "None",
        "steps": [step], "array_job_id": array, "array_task_id": task,
    }  # fmt: skip
    return api.AcctJob(**(values | fields))


def test_sacct_rows_of_array_tasks() -> None:
    jobs = [acct(20, 0, 20), acct(21, 1, 20, state="CANCELLED", cancelled_by="alice"), acct(26, None, None)]
    args = sacct.parse_args(["-P", "-o", "JobID,JobIDRaw,ArrayJobID,ArrayTaskID,State"])
    lines = sacct.render_acct(jobs, args.columns, parsable="P", now=T0 + 9, uid_of=lambda u: "1000")
    assert lines == [
        "JobID|JobIDRaw|ArrayJobID|ArrayTaskID|State",
        "20_0|20|20|0|COMPLETED",
        "20_0.batch|20.batch|20|0|COMPLETED",
        "20_1|21|20|1|CANCELLED by 1000",
        "20_1.batch|21.batch|20|1|COMPLETED",
        "26|26|||COMPLETED",
        "26.batch|26.batch|||COMPLETED",
    ]
    for argv, shown in [(["-j", "20"], [20, 21]), (["-j", "20_1"], [21]), (["-j", "21,26"], [21, 26])]:
        parsed = sacct.parse_args(argv)
        assert [j.job_id for j in sacct.select_jobs(jobs, parsed)] == shown, argv


@pytest.mark.parametrize(
    ("items", "refs"),
    [
        (["5"], [JobRef(5)]),
        (["5_2"], [JobRef(5, (2,))]),
        (["5_[1-3,7]"], [JobRef(5, (1, 2, 3, 7))]),
        (["5_[1-7:3]", "5"], [JobRef(5, (1, 4, 7)), JobRef(5)]),
    ],
    ids=["id", "task", "tasks", "stepped and whole"],
)
def test_job_references(items: list[str], refs: list[JobRef]) -> None:
    assert parse_job_refs(items, "job id") == refs


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("5_[3-1]", "Invalid job id 5_[3-1]: a range N-M needs 0 <= N <= M"),
        ("5_[1-3", "Invalid job id 5_[1-3"),
        ("5_", "Invalid job id 5_"),
        ("0_1", "Invalid job id 0_1"),
        ("5.batch", "job id 5.batch: job steps are not supported here by Corral yet"),
    ],
    ids=["reversed", "unclosed", "no index", "zero", "step"],
)
def test_bad_job_references(item: str, message: str) -> None:
    with pytest.raises(CliError) as info:
        parse_job_refs([item], "job id")
    assert info.value.message == message


def test_job_lists_keep_bracketed_commas() -> None:
    assert split_job_list(["5,7_[1,3],9", "10"]) == ["5", "7_[1,3]", "9", "10"]


def test_scancel_sends_tasks_by_index() -> None:
    request = cancel_request(parse_job_refs(["20", "30_2", "30_[4-5]", "31_0"], "job id"))
    assert request == api.CancelRequest(
        job_ids=[20],
        tasks=[
            api.ArrayTasks(array_job_id=30, task_ids=[2, 4, 5]),
            api.ArrayTasks(array_job_id=31, task_ids=[0]),
        ],
    )


# --- the gateway finds tasks by their own id ------------------------------------------------------


class FakeBus:
    """The two reads JobLookup makes, over a dict of submissions by job id."""

    def __init__(self, *submissions: ev.JobSubmitted) -> None:
        self.entries = {s.job_id: LogEntry(seq, "", env(s)) for seq, s in enumerate(submissions, 1)}
        self.gets = 0  # subjects read
        self.requests = 0  # batched reads

    async def last_entry(self, subject: str) -> LogEntry | None:
        self.gets += 1
        return self.entries.get(int(subject.split(".")[3]))

    async def last_entries(self, wanted: list[str]) -> dict[str, LogEntry]:
        self.requests += 1
        found = {subject: await self.last_entry(subject) for subject in wanted}
        return {subject: entry for subject, entry in found.items() if entry is not None}

    async def last_job_id(self) -> int:
        return 2000


def lookup_of(bus: FakeBus) -> JobLookup:
    return JobLookup(cast(Bus, bus), cast(Bus, bus))


async def test_lookup_of_arrays_tasks_and_jobs() -> None:
    bus = FakeBus(submitted(3), submitted(10, array_job("2,4,6-8")), submitted(15))
    lookup = lookup_of(bus)
    whole = await lookup.find(10)
    assert whole is not None and (whole.whole_array, whole.job_ids) == (True, [10, 11, 12, 13, 14])
    task = await lookup.find(13)
    assert task is not None and (task.job_id, task.task_index, task.whole_array) == (13, 7, False)
    by_index = await lookup.task(10, 6)
    assert by_index is not None and (by_index.job_id, by_index.task_index) == (12, 6)
    assert await lookup.task(10, 5) is None  # no such index
    assert await lookup.task(3, 0) is None  # not an array
    plain = await lookup.find(3)
    assert plain is not None and (plain.whole_array, plain.job_ids) == (False, [3])
    assert await lookup.find(9) is None  # below it is job 3, not an array
    assert await lookup.find(2500) is None  # above the id counter
    bus.gets = bus.requests = 0
    assert await lookup.find(1500) is None  # nothing within MaxArraySize below: a bounded search
    assert bus.gets == MAX_ARRAY_SIZE
    assert bus.requests == -(-(MAX_ARRAY_SIZE - 1) // PROBE_CHUNK)  # the rest in chunks, each one request


async def test_a_requests_ids_are_looked_up_in_a_few_batched_reads() -> None:
    # scancel -u of 20,000 jobs read each job's submission with a request of its own: ~25% of the gateway's
    # time. Their own subjects are read at once; only the ids without one (a task's own id) are searched.
    bus = FakeBus(*(submitted(i) for i in range(1, 1501)), submitted(1600, array_job("0-9")))
    lookup = lookup_of(bus)
    ids = [*range(1500, 0, -1), 1600, 1605, 1700, 3]
    targets = await lookup.targets(ids, [])
    assert [t.found.job_id if t.found else None for t in targets] == [
        *range(1500, 0, -1),
        1600,
        1605,
        None,
        3,
    ]
    assert targets[-3].found is not None and targets[-3].found.task_index == 5
    assert targets[-4].found is not None and targets[-4].found.whole_array
    # One batched read of every id's own subject, then the searches below 1605 (1600, in the first chunk)
    # and below 1700 (1600 in the second chunk of 64: its array has no task 100 ids above it).
    assert bus.requests == 1 + 1 + 2


def test_squeue_by_id_looks_the_jobs_up_and_shows_what_a_pass_over_every_job_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # srun asks for its job 50 times a second while it waits, and every scheduler answers: a pass over every
    # job of the state (6.9 ms for 50,000) each time. The named jobs and their arrays' tasks are looked up.
    log, _ = throttled_array()
    log.add(submitted(40, array_job("0-3")), submitted(44, job(nodes=1, gpus=1, name="late")))
    finish_running(log)
    out = cycle(log)  # tasks 20 and 21 end; 22 and 23 start
    for _ in range(2):
        finish_running(log)
        out = cycle(log)
    requests = [[20], [21], [22, 40], [26], [41], [44, 20], [99], [20, 99], [40, 41], [26, 44, 40, 20]]
    looked_up = {tuple(ids): infos(log, out, job_ids=ids) for ids in requests}
    assert [j.job_id for j in looked_up[(20,)]] == [20, 21, 22, 23, 24, 25]  # an array's id: every task
    assert [j.job_id for j in looked_up[(41,)]] == [41]  # a task's id: the task
    monkeypatch.setattr(views, "_candidates", lambda state, *_: state.jobs.values())
    assert looked_up == {tuple(ids): infos(log, out, job_ids=ids) for ids in requests}
