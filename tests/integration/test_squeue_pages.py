"""squeue, sprio, sinfo and sshare over thousands of jobs, nodes or associations (a real nats-server, the
scheduler's ``jobs``, ``priority``, ``nodes`` and ``shares`` verbs, the commands' client): the reply comes in
pages by job id (node name, row), each under the verb's bound, and the client asks for every page. One reply
of 10,000 jobs was ~8 MB of JSON, over the server's max_payload: squeue waited 15 s and failed. sprio's reply
had the same bound (~244 B a job: over the decoders' 4 MiB at ~17,000), sinfo's (~280 B a node: at ~15,000
nodes) and sshare's (~156 B a row: at ~27,000 associations)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from test_rebuild_paths import PASSWORDS, buses, server
from test_scheduler_cycle import CONFIG, fold_new, registered, spec

from corral.cli import squeue
from corral.cli.client import Cluster
from corral.libs.config.cluster import parse_config
from corral.libs.core.priority import queue_order
from corral.libs.infra import roles
from corral.libs.runtime.api_server import EVERY_SUBSCRIBER, serve
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.scheduler import priority_views, views
from corral.services.scheduler.app import Scheduler

pytestmark = pytest.mark.integration

# the fixtures this module uses from test_rebuild_paths: fresh streams, the scheduler's bus and the admin's
__all__ = ["buses", "server"]


async def through_client(
    buses: tuple[Bus, Bus],
    verb: str,
    kind: type[Any],
    answer: Callable[[str, Any], Awaitable[Any]],
    read: Callable[[Cluster, Any], Any],
    request: Any,
) -> tuple[Any, list[tuple[Any, Any]]]:
    """``read(client, request)`` (a ``Cluster`` method, as the commands call it) against a real server where
    ``answer`` (a scheduler's verb) serves ``verb``: what it returned, and each (request, reply) it asked."""
    bus, admin = buses
    asked: list[tuple[Any, Any]] = []

    async def counted(user: str, req: Any) -> Any:
        reply = await answer(user, req)
        asked.append((req, reply))
        return reply

    sub = await serve(bus.nc, verb, kind, counted, queue=EVERY_SUBSCRIBER)
    try:
        creds = Credentials(
            url=admin.nc.connected_url.geturl(), user=roles.ADMIN, password=PASSWORDS[roles.ADMIN]
        )
        shown = await asyncio.to_thread(read, Cluster(url=creds.url, credentials=creds), request)
    finally:
        await sub.unsubscribe()
    return shown, asked


def paged(asked: list[tuple[Any, Any]], at_least: int) -> None:
    """At least ``at_least`` pages, each but the last saying more follow."""
    assert len(asked) >= at_least
    assert all(reply.more for _, reply in asked[:-1]) and not asked[-1][1].more


async def test_squeue_reads_a_queue_larger_than_one_reply_page_by_page(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await registered(admin)
    ids = list(range(60, 0, -1))  # submitted in the reverse order of their ids
    for job_id in ids:
        await admin.append(ev.JobSubmitted(job_id=job_id, user="alice", spec=spec(f"j{job_id}")))
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    await live.cycle()  # the 12 that fit start (their allocations on their way back), 48 wait
    # A bound of ~7 jobs a page here; the real one (3 MiB) holds ~3,700 (tests/unit/test_views.py).
    monkeypatch.setattr(views, "MAX_REPLY_BYTES", 6000)
    request = api.JobsRequest(users=["alice"])
    shown, asked = await through_client(buses, "jobs", api.JobsRequest, live.jobs, Cluster.jobs, request)
    assert [j.job_id for j in shown] == sorted(ids)
    paged(asked, 8)
    assert all(reply.jobs for _, reply in asked)


async def test_sprio_reads_a_queue_larger_than_one_reply_page_by_page_in_queue_order(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await registered(admin)
    for job_id in range(1, 41):
        await admin.append(ev.JobSubmitted(job_id=job_id, user="alice", spec=spec(f"j{job_id}")))
    await admin.append(ev.JobUpdateRequested(job_id=30, user="root", admin=True, priority=500))
    await admin.append(ev.JobUpdated(job_id=30, by="root", time_limit_s=None, partition=None, priority=500))
    await admin.append(ev.JobHeld(job_id=2, by="alice"))
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    whole = await live.priority("alice", api.PriorityRequest())  # one page under the real bound
    assert not whole.more and len(whole.jobs) == 40
    monkeypatch.setattr(priority_views, "MAX_REPLY_BYTES", 2000)  # ~5 jobs a page
    request = api.PriorityRequest()
    shown, asked = await through_client(
        buses, "priority", api.PriorityRequest, live.priority, Cluster.priorities, request
    )
    paged(asked, 6)
    order = [
        job.job_id
        for job, _ in queue_order(
            live.state, time.time(), live.policy, [live.state.jobs[i] for i in range(1, 41)]
        )
    ]
    assert [j.job_id for j in shown.jobs] == order
    assert order[0] == 30 and [j.priority for j in shown.jobs if j.job_id == 2] == [0]
    assert shown.weights == whole.weights and not shown.more


async def test_sinfo_reads_thousands_of_nodes_page_by_page(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, _ = buses
    config = parse_config(
        '[[nodes]]\nnames = "pg[1-30]"\ncpus = 8\nmemory = "16G"\n\n'
        '[[partitions]]\nname = "batch"\nnodes = "pg[1-30]"\ndefault = true\n'
    )
    live = Scheduler(bus, config)
    await live.rebuild()
    # A bound of ~4 nodes a page here; the real one (3 MiB) holds ~11,000 (tests/unit/test_views.py).
    monkeypatch.setattr(views, "MAX_REPLY_BYTES", 1500)
    shown, asked = await through_client(
        buses, "nodes", api.NodesRequest, live.nodes, Cluster.nodes, api.NodesRequest()
    )
    paged(asked, 6)
    assert [n.name for n in shown.nodes] == sorted(f"pg{i}" for i in range(1, 31))
    assert [p.name for p in shown.partitions] == ["batch"] and not shown.more


async def test_sshare_reads_a_tree_larger_than_one_reply_page_by_page(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    bus, admin = buses
    await registered(admin)
    for job_id in range(1, 13):
        await admin.append(ev.JobSubmitted(job_id=job_id, user=f"user{job_id}", spec=spec(f"j{job_id}")))
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    whole = await live.shares("alice", api.SharesRequest(all_users=True))  # one page under the real bound
    assert len(whole.rows) == 1 + 2 * 12 and not whole.more  # root, each user's account and association
    monkeypatch.setattr(priority_views, "MAX_REPLY_BYTES", 800)  # ~4 rows a page
    request = api.SharesRequest(all_users=True)
    shown, asked = await through_client(
        buses, "shares", api.SharesRequest, live.shares, Cluster.shares, request
    )
    paged(asked, 5)
    starts = [req.start for req, _ in asked]
    assert starts == [sum(len(reply.rows) for _, reply in asked[:k]) for k in range(len(asked))]
    assert shown.rows == whole.rows and not shown.more


async def test_squeue_of_a_user_shows_their_jobs_folded_before_and_after_the_rebuild(
    buses: tuple[Bus, Bus],
) -> None:
    bus, admin = buses
    await registered(admin)
    await admin.append(ev.JobSubmitted(job_id=1, user="alice", spec=spec("a1")))
    await admin.append(ev.JobSubmitted(job_id=2, user="bob", spec=spec("b2")))
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    array = msgspec.structs.replace(spec("b3"), array=parse_array("0-3"))
    await admin.append(ev.JobSubmitted(job_id=3, user="bob", spec=array))  # tasks 3-6
    await admin.append(ev.JobSubmitted(job_id=7, user="alice", spec=spec("a7")))
    await admin.append(ev.JobSubmitted(job_id=2, user="carol", spec=spec("c2")))  # a duplicate id: not taken
    await fold_new(live, bus)
    for users, ids in (
        (["bob"], [2, 3, 4, 5, 6]),
        (["alice"], [1, 7]),
        (["carol"], []),
        (["bob", "alice"], list(range(1, 8))),
    ):
        reply = await live.jobs("alice", api.JobsRequest(users=users))
        assert [j.job_id for j in reply.jobs] == ids, users
        assert reply == views.jobs_reply(
            live.state, live.outlook, live.policy, api.JobsRequest(users=users), time.time()
        )


async def test_squeue_gets_arrays_pending_tasks_as_rows_page_by_page(
    buses: tuple[Bus, Bus], monkeypatch: pytest.MonkeyPatch
) -> None:
    # squeue without -r shows an array's pending tasks as one A_[x-y] row: the scheduler (rebuilt from the
    # log, so every task's job and spec decoded on its own) sends them so, an array's alike tasks as one row,
    # pages ending between arrays (services/scheduler/array_rows.py); squeue shows what it showed when it
    # was sent every task.
    bus, admin = buses
    await registered(admin)
    for a in range(6):
        array = msgspec.structs.replace(spec(f"sweep{a}"), array=parse_array("0-39"))
        await admin.append(ev.JobSubmitted(job_id=1 + 100 * a, user="alice", spec=array))
    await admin.append(ev.JobHeld(job_id=105, by="alice"))
    live = Scheduler(bus, CONFIG)
    await live.rebuild()
    await live.cycle()  # the 12 GPUs start 12 tasks of the first array
    await fold_new(live, bus)
    monkeypatch.setattr(views, "MAX_REPLY_BYTES", 3000)  # about an array's rows a page
    args = squeue.parse_args([])
    request = squeue.jobs_request(args, "alice")
    assert request.collapse_arrays
    rows, asked = await through_client(buses, "jobs", api.JobsRequest, live.jobs, Cluster.jobs, request)
    paged(asked, 3)
    tasks, _ = await through_client(
        buses,
        "jobs",
        api.JobsRequest,
        live.jobs,
        Cluster.jobs,
        msgspec.structs.replace(request, collapse_arrays=False),
    )
    # 12 running tasks; array 1's next one (Resources), the rest of it (Priority) and its held task; a row
    # for each other array.
    assert len(tasks) == 240 and len(rows) == 12 + 3 + 5
    assert sorted(i for r in rows for i in r.array_tasks or [r.array_task_id]) == sorted(
        t.array_task_id for t in tasks
    )
    now = time.time()
    assert squeue.output(rows, args, now) == squeue.output(tasks, args, now)
