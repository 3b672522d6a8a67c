"""squeue of pending arrays: the scheduler sends an array's alike pending tasks as one row, and squeue shows
exactly what it showed when it was sent every task (``services/scheduler/array_rows.py``)."""

from __future__ import annotations

from datetime import UTC
from typing import Any

import msgspec
import pytest
from builders import Log, cluster, job, partition, policy, submitted

from corral.cli import squeue
from corral.cli.client import every_page
from corral.libs.core.plan import Plan, plan
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.scheduler import views

pytestmark = pytest.mark.unit

POLICY = policy(partition("gpu", max_s=86_400, default_s=3600))

#: squeue command lines whose output must not change: the default, the formats and sorts users use.
ARGVS = [
    [],
    ["-h", "-o", "%i %A %F %K %t %r %l %Q %j"],
    ["-h", "-o", "%i %t %r", "-S", "-p,i"],
    ["-h", "-o", "%i %t %r", "-S", "l,V"],
    ["-h", "-o", "%i %r", "-t", "PD"],
    ["-h", "-o", "%i %r", "--start"],
    ["-h", "-o", "%i %u %a %q", "-A", "alice"],
    ["-h", "-o", "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R", "-S", "r"],
]


def array_job(text: str, **fields: Any) -> ev.JobSpec:
    fields.setdefault("gpus", 1)
    fields.setdefault("nodes", 1)
    return job(array=parse_array(text), **fields)


def sweep() -> tuple[Log, Plan]:
    """Array 20 (0-99%2): tasks 0 and 1 run, the rest wait for the throttle, task 5 held by its owner and
    task 10 given another time limit; array 200 (0-49, a whole node each) waits for resources and priority;
    job 300 alone."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(
        submitted(20, array_job("0-99%2")),
        submitted(200, array_job("0-49", gpus=8, name="big")),
        submitted(300, job(nodes=1, gpus=1, name="solo")),
    )
    log.add(*plan(log.state, log.state.now, POLICY).decisions)
    log.add(ev.JobHoldRequested(job_id=25, user="alice"), ev.JobHeld(job_id=25, by="alice"))
    log.add(ev.JobUpdated(job_id=30, by="alice", time_limit_s=600, partition=None))
    out = plan(log.state, log.state.now, POLICY)
    log.add(*out.decisions)
    return log, out


def lines(log: Log, out: Plan, argv: list[str], collapse: bool | None = None) -> tuple[list[str], int]:
    """squeue's output for ``argv`` and how many rows the scheduler sent; ``collapse`` overrides the
    command's choice."""
    args = squeue.parse_args(argv)
    request = squeue.jobs_request(args, "alice")
    if collapse is not None:
        request = msgspec.structs.replace(request, collapse_arrays=collapse)
    found = every_page(lambda req: views.jobs_reply(log.state, out, POLICY, req, log.state.now), request)
    return squeue.output(found, args, log.state.now, UTC), len(found)


def test_a_pending_array_comes_as_one_row_and_squeue_shows_what_it_showed() -> None:
    log, out = sweep()
    shown, rows = lines(log, out, ["-h", "-o", "%i %t %r"])
    assert shown == [
        "20_[2-4,6-99%2] PD JobArrayTaskLimit",
        "200_0 PD Resources",
        "200_[1-49] PD Priority",
        "20_5 PD JobHeldUser",
        "20_0 R None",
        "20_1 R None",
        "300 R None",
    ]
    assert shown == lines(log, out, ["-h", "-o", "%i %t %r"], collapse=False)[0]
    # 151 jobs. The scheduler sent 8 rows: array 20's 2 running tasks, its alike pending tasks as one row, the
    # held task and the updated one (another time limit, the same reason: squeue merges it back) as rows of
    # their own; array 200's first task (planned to start: its own reason) and the rest as one row; job 300.
    assert len(log.state.jobs) == 151
    assert rows == 8


@pytest.mark.parametrize("argv", ARGVS, ids=[" ".join(a) or "default" for a in ARGVS])
def test_squeue_shows_the_same_lines_from_rows_as_from_every_task(argv: list[str]) -> None:
    log, out = sweep()
    collapsed, rows = lines(log, out, argv)
    every, tasks = lines(log, out, argv, collapse=False)
    assert collapsed == every
    assert rows < tasks


def test_rows_are_asked_for_only_where_squeue_merges_tasks() -> None:
    for argv, collapse in [
        ([], True),
        (["-S", "i"], True),
        (["-r"], False),  # a row per task
        (["-j", "20"], False),  # -j may name one task of a row
        (["-S", "-i"], False),  # a merged row goes where its last task would
    ]:
        assert squeue.jobs_request(squeue.parse_args(argv), "alice").collapse_arrays is collapse, argv


def paged(pages: list[api.JobsReply], log: Log, out: Plan, req: api.JobsRequest) -> api.JobsReply:
    """The scheduler's reply to ``req``, kept in ``pages``."""
    pages.append(views.jobs_reply(log.state, out, POLICY, req, log.state.now))
    return pages[-1]


def test_a_page_never_splits_an_array(monkeypatch: pytest.MonkeyPatch) -> None:
    # 40 arrays whose tasks are not all alike (every seventh held): each array is a few rows standing for
    # interleaved tasks. A page ends between arrays and says the largest id it covers, from which the next
    # one starts: no task is sent twice or lost, whatever the page's size.
    log = Log(*cluster(nodes=1, gpus=8))
    for a in range(40):
        log.add(submitted(1 + a * 100, array_job("0-49", gpus=8)))
    for job_id in list(log.state.jobs)[::7]:
        log.add(ev.JobHoldRequested(job_id=job_id, user="alice"), ev.JobHeld(job_id=job_id, by="alice"))
    out = plan(log.state, log.state.now, POLICY)
    every = lines(log, out, [], collapse=False)[0]
    for bound in (10, 2_000, 20_000):
        monkeypatch.setattr(views, "MAX_REPLY_BYTES", bound)
        pages: list[api.JobsReply] = []
        request = squeue.jobs_request(squeue.parse_args([]), "alice")
        found = every_page(lambda req, pages=pages: paged(pages, log, out, req), request)
        tasks = [i for info in found for i in info.array_tasks or (info.array_task_id,)]
        assert sorted(tasks) == sorted(j.array_task_id for j in log.state.jobs.values())
        if bound == 10:  # a page of one array each
            assert [len({info.array_job_id for info in page.jobs}) for page in pages] == [1] * 40
        assert squeue.output(found, squeue.parse_args([]), log.state.now, UTC) == every
        assert len(pages) > 1


@pytest.mark.parametrize("bound", [10, 2_000, 3 << 20])
@pytest.mark.parametrize("collapse", [True, False])
def test_pages_from_the_kept_job_order_are_the_pages_of_a_pass_over_every_job(
    bound: int, collapse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing of every job (squeue without -j or -u) pages through the ids kept in order for the log
    position (``views.JobOrder``) instead of passing over every job and sorting for each page: the same pages,
    for every filter and page size, and after the state moved between two pages."""
    monkeypatch.setattr(views, "MAX_REPLY_BYTES", bound)
    log, out = sweep()
    log.add(*plan(log.state, log.state.now, POLICY).decisions)
    running = next(j for j in log.state.jobs.values() if j.state == "RUNNING")
    log.add(ev.RunExited(job_id=running.job_id, attempt=0, node="gpu01", exit_code=0))
    log.add(*plan(log.state, log.state.now, POLICY).decisions)  # an ended job, for include_finished
    assert any(j.state == "COMPLETED" for j in log.state.jobs.values())
    requests = [
        api.JobsRequest(collapse_arrays=collapse),
        api.JobsRequest(collapse_arrays=collapse, include_finished=True),
        api.JobsRequest(collapse_arrays=collapse, states=["PD"]),
        api.JobsRequest(collapse_arrays=collapse, partitions=["gpu"], states=["R"]),
    ]
    order = views.JobOrder()
    for request in requests:
        kept = [
            views.jobs_reply(log.state, out, POLICY, req, log.state.now, None, order)
            for req in _pages(log, out, request, order)
        ]
        passed = [
            views.jobs_reply(log.state, out, POLICY, req, log.state.now) for req in _pages(log, out, request)
        ]
        assert kept == passed, request
        assert len(kept) > 1 or bound > 2_000 or request.states, request  # (small pages: several)
    # The state moves between two pages: the next page is the one a pass over every job gives.
    first = views.jobs_reply(log.state, out, POLICY, requests[0], log.state.now, None, order)
    log.add(submitted(400, job(nodes=1, gpus=1, name="late")))
    after = msgspec.structs.replace(requests[0], after_job_id=_last(first, collapse))
    assert views.jobs_reply(log.state, out, POLICY, after, log.state.now, None, order) == views.jobs_reply(
        log.state, out, POLICY, after, log.state.now
    )


def _last(reply: api.JobsReply, collapse: bool) -> int:
    return reply.last_job_id if collapse else reply.jobs[-1].job_id


def _pages(
    log: Log, out: Plan, request: api.JobsRequest, order: views.JobOrder | None = None
) -> list[api.JobsRequest]:
    """The requests of every page of ``request`` (each after the last job of the one before)."""
    asked = [request]
    while True:
        reply = views.jobs_reply(log.state, out, POLICY, asked[-1], log.state.now, None, order)
        if not reply.more:
            return asked
        asked.append(msgspec.structs.replace(request, after_job_id=_last(reply, request.collapse_arrays)))
