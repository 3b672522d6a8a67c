"""What squeue and sinfo see: job and node views built from the scheduler's state."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from builders import T0, Log, allocated, cluster, cluster_config, exited, job, partition, policy, submitted

from corral.libs.core.plan import Plan
from corral.libs.core.state import Node
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.scheduler import views
from corral.services.scheduler.owners import Owners
from corral.services.scheduler.views import (
    MIN_JOB_AGE_S,
    job_info,
    jobs_reply,
    node_state,
    nodes_reply,
    policy_of,
)

pytestmark = pytest.mark.unit

POLICY = policy(partition("gpu", max_s=86_400, default_s=3600))


def queue() -> Log:
    """Job 1 (alice, 2 nodes) runs on gpu01-02 since T0+4; job 2 (bob, submitted T0+3) is pending."""
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(gpus=8, nodes=2, name="big")))
    log.add(submitted(2, job(gpus=2, nodes=1, ntasks=2, cpus_per_task=4, account="ml"), user="bob"))
    log.add(allocated(1, {"gpu01": list(range(8)), "gpu02": list(range(8))}, cpus=3, time_s=7200))
    return log


def test_a_pending_job() -> None:
    log = queue()
    info = job_info(log.state.jobs[2], Plan(reasons={2: "Resources"}), POLICY)
    assert info == api.JobInfo(
        job_id=2,
        name="train",
        user="bob",
        account="ml",
        partition="gpu",
        state="PENDING",
        reason="Resources",
        submit_time=T0 + 3,
        start_time=None,
        end_time=None,
        time_limit_s=3600,
        num_nodes=1,
        num_cpus=8,
        num_tasks=2,
        gpus_per_node=2,
        gpu_type=None,
        min_memory_mb=None,
        node_list="",
        restart_count=0,
        priority=1,
        workdir="/home/alice/run",
        qos="normal",
        cpus_per_task=4,
    )


def test_a_running_job() -> None:
    log = queue()
    info = job_info(log.state.jobs[1], Plan(reasons={1: "Priority"}), POLICY)
    assert (info.state, info.reason, info.user, info.account, info.name) == (
        "RUNNING",
        "None",
        "alice",
        "alice",
        "big",
    )
    assert (info.node_list, info.num_nodes, info.num_cpus, info.gpus_per_node) == ("gpu[01-02]", 2, 6, 8)
    assert (info.start_time, info.time_limit_s, info.partition) == (T0 + 4, 7200, "gpu")


def test_a_requeued_job_shows_its_restart_count_and_no_nodes() -> None:
    log = queue()
    log.add(exited(1, "gpu01", killed=True), ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"))
    info = job_info(log.state.jobs[1], Plan(reasons={1: "Priority"}), POLICY)
    assert (info.state, info.restart_count, info.node_list, info.num_nodes, info.start_time) == (
        "PENDING",
        1,
        "",
        2,
        None,
    )


def reply(log: Log, now: float = T0 + 100, **request: object) -> list[tuple[int, str, str]]:
    """(job id, state, reason) of a squeue reply."""
    req = api.JobsRequest(**request)  # type: ignore[arg-type]
    out = jobs_reply(log.state, Plan(reasons={2: "Resources"}), POLICY, req, now)
    return [(j.job_id, j.state, j.reason) for j in out.jobs]


def test_squeue_shows_live_jobs_with_their_reasons() -> None:
    log = queue()
    log.add(submitted(3, job(nodes=1)))
    assert reply(log) == [(1, "RUNNING", "None"), (2, "PENDING", "Resources"), (3, "PENDING", "Priority")]
    assert reply(log, users=["bob"]) == [(2, "PENDING", "Resources")]
    assert reply(log, states=["RUNNING"]) == [(1, "RUNNING", "None")]
    assert reply(log, partitions=["cpu"]) == []


def test_an_ended_job_is_shown_only_when_asked_for_and_recent() -> None:
    log = queue()
    log.add(exited(1, "gpu01"), ev.JobCompleted(job_id=1, attempt=0))
    ended = log.at
    assert [j for j, *_ in reply(log, now=ended)] == [2]
    assert reply(log, now=ended, job_ids=[1]) == [(1, "COMPLETED", "None")]
    assert [j for j, *_ in reply(log, now=ended, include_finished=True)] == [1, 2]
    assert reply(log, now=ended + MIN_JOB_AGE_S + 1, job_ids=[1]) == []


def node(gpus: int = 8, cpus: int = 64, used_gpus: int = 0, alloc_cpus: int = 0, up: bool = True) -> Node:
    """A node with some usage (one running job when anything is used)."""
    busy = used_gpus or alloc_cpus
    return Node(
        name="n1",
        cpus=cpus,
        mem_mb=1000,
        gpus=gpus,
        gpu_type=None,
        partitions=["gpu"],
        features=[],
        up=up,
        used_gpus=list(range(used_gpus)),
        alloc_cpus=alloc_cpus,
        jobs=[1] if busy else [],
    )


NODE_STATES = [
    (node(), "idle", "idle"),
    (node(used_gpus=4, alloc_cpus=4), "mixed", "some GPUs"),
    (node(used_gpus=8, alloc_cpus=8), "allocated", "all GPUs"),
    (node(gpus=0, cpus=16, alloc_cpus=8), "mixed", "CPU node, some CPUs"),
    (node(gpus=0, cpus=16, alloc_cpus=16), "allocated", "CPU node, all CPUs"),
    (node(gpus=4, cpus=16, used_gpus=1, alloc_cpus=16), "allocated", "all CPUs, GPUs left"),
    (node(up=False), "down", "down"),
    (node(used_gpus=8, alloc_cpus=8, up=False), "down", "down while allocated"),
]


@pytest.mark.parametrize(("n", "state"), [c[:2] for c in NODE_STATES], ids=[c[2] for c in NODE_STATES])
def test_node_state(n: Node, state: str) -> None:
    assert node_state(n) == state


def test_sinfo_shows_every_configured_node() -> None:
    config = cluster_config(nodes=3)
    log = queue()  # gpu01 and gpu02 registered and allocated; gpu03 and the CPU nodes never registered
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"))
    out = nodes_reply(log.state, config, api.NodesRequest())
    rows = [(n.name, n.state, n.reason, n.alloc_gpus, n.alloc_cpus, n.partitions) for n in out.nodes]
    assert rows == [
        ("cpu01", "unknown", "Not registered", 0, 0, ["cpu"]),
        ("cpu02", "unknown", "Not registered", 0, 0, ["cpu"]),
        ("gpu01", "allocated", "", 8, 3, ["gpu"]),
        ("gpu02", "down", "Not responding", 8, 3, ["gpu"]),
        ("gpu03", "unknown", "Not registered", 0, 0, ["gpu"]),
    ]
    unknown = out.nodes[4]
    assert (unknown.cpus, unknown.gpus, unknown.gpu_type, unknown.mem_mb) == (64, 8, "h100", 500 * 1024)
    assert [(p.name, p.default, p.max_time_s, p.default_time_s) for p in out.partitions] == [
        ("gpu", True, 86_400, 3600),
        ("cpu", False, None, None),
    ]


def test_sinfo_of_one_partition() -> None:
    out = nodes_reply(Log().state, cluster_config(nodes=2), api.NodesRequest(partitions=["cpu"]))
    assert [n.name for n in out.nodes] == ["cpu01", "cpu02"]
    assert [p.name for p in out.partitions] == ["cpu"]


def test_policy_of_a_config() -> None:
    pol = policy_of(cluster_config())
    assert pol.cluster == "test"
    gpu, cpu = (p.size for p in pol.partitions)  # their configured nodes (PartitionConfig)
    assert pol.partitions == (
        dataclasses.replace(partition("gpu", default=True, max_s=86_400, default_s=3600), size=gpu),
        dataclasses.replace(partition("cpu", default=False), size=cpu),
    )
    assert gpu is not None and gpu > 0 and cpu is not None
    assert pol.default_partition == "gpu"


def test_a_job_no_longer_pending_shows_a_priority_as_in_slurm() -> None:
    """Slurm keeps a started job's priority (Corral showed 0): the multifactor sum now (submitted T0+2)."""
    from dataclasses import replace

    from corral.libs.core.priority import PriorityWeights

    log = queue()
    weighted = replace(POLICY, weights=PriorityWeights(age=1000, max_age_s=100.0))
    jobs = jobs_reply(log.state, Plan(priorities={2: 40}), weighted, api.JobsRequest(), T0 + 50).jobs
    assert {j.job_id: (j.state, j.priority) for j in jobs} == {1: ("RUNNING", 480), 2: ("PENDING", 40)}
    flat = jobs_reply(log.state, Plan(), POLICY, api.JobsRequest(), T0 + 50).jobs
    assert [j.priority for j in flat if j.state == "RUNNING"] == [1]


def test_job_info_carries_what_scontrol_show_job_prints() -> None:
    from msgspec.structs import replace

    from corral.libs.slurm.constraint import parse_constraint

    spec = replace(
        job(gpus=2, nodes=1, ntasks_per_node=2, cpus_per_task=3),
        command="/home/alice/run/train.sh",
        constraint=parse_constraint("ib&a100", "--constraint"),
        nodelist=["gpu01", "gpu02"],
        exclude=["gpu05"],
        reservation="maint",
        exclusive=True,
        cpus_per_gpu=3,
        submit_host="login1",
    )
    log = Log(*cluster(nodes=4))
    log.add(submitted(1, spec))
    info = job_info(log.state.jobs[1], Plan(at=T0 + 7), POLICY)
    assert (info.command, info.features, info.req_nodes, info.exc_nodes, info.reservation) == (
        "/home/alice/run/train.sh",
        "ib&a100",
        "gpu[01-02]",
        "gpu05",
        "maint",
    )
    assert (info.exclusive, info.ntasks_per_node, info.cpus_per_task, info.cpus_per_gpu) == (True, 2, 3, 3)
    assert (info.alloc_node, info.last_sched_eval) == ("login1", T0 + 7)


def test_partitions_carry_what_scontrol_show_partition_prints() -> None:
    """PreemptMode is OFF without preemption, else the partition's or the cluster's, in Slurm's capitals."""
    from dataclasses import replace

    config = cluster_config(nodes=2)
    gpu, cpu = config.partitions
    config = replace(
        config,
        partitions=(
            replace(gpu, priority_tier=3, max_nodes=2, qos="high", allow_qos=("high",), grace_time_s=30.0),
            replace(cpu, preempt_mode="cancel", allow_accounts=("ml",)),
        ),
    )
    shown = nodes_reply(Log().state, config, api.NodesRequest()).partitions
    assert [
        (p.priority_tier, p.max_nodes, p.qos, p.allow_qos, p.allow_accounts, p.grace_time_s) for p in shown
    ] == [
        (3, 2, "high", ["high"], [], 30),
        (1, None, "", [], ["ml"], 0),
    ]
    assert [p.preempt_mode for p in shown] == ["OFF", "OFF"]
    preempting = replace(config, scheduler=replace(config.scheduler, preempt_type="partition_prio"))
    shown = nodes_reply(Log().state, preempting, api.NodesRequest()).partitions
    assert [p.preempt_mode for p in shown] == ["REQUEUE", "CANCEL"]


def test_a_queue_of_thousands_comes_in_pages_that_each_fit_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # 12,000 pending jobs are ~10 MB of JSON: more than NATS's max_payload (8 MiB here) and the decoders'
    # 4 MiB. The verb sends them by id, a page at a time, each under MAX_REPLY_BYTES, until none is left.
    log = Log(*cluster(nodes=2))
    ids = list(range(12_000, 0, -1))  # submitted in the reverse order of their ids (a second gateway's block)
    for job_id in ids:
        log.add(submitted(job_id, job(gpus=1, name=f"sweep-{job_id}")))
    pages, after = [], 0
    while True:
        out = jobs_reply(log.state, Plan(), POLICY, api.JobsRequest(after_job_id=after), T0 + 100)
        assert len(msgspec.json.encode(out)) <= views.MAX_REPLY_BYTES + 64
        pages.append(out)
        if not out.more:
            break
        after = out.jobs[-1].job_id
    assert len(pages) >= 3
    shown = [j.job_id for page in pages for j in page.jobs]
    assert shown == sorted(ids)
    # A page holds one job at least, whatever its size, so that paging always ends.
    monkeypatch.setattr(views, "MAX_REPLY_BYTES", 10)
    first = jobs_reply(log.state, Plan(), POLICY, api.JobsRequest(after_job_id=11_998), T0 + 100)
    assert ([j.job_id for j in first.jobs], first.more) == ([11_999], True)
    last = jobs_reply(log.state, Plan(), POLICY, api.JobsRequest(after_job_id=11_999), T0 + 100)
    assert ([j.job_id for j in last.jobs], last.more) == ([12_000], False)


def test_squeue_of_some_users_reads_their_jobs_and_shows_what_a_pass_over_every_job_shows() -> None:
    # squeue --me and the gateway's MaxSubmitJobs count name users: their jobs come from the shell's Owners
    # (each submission the fold took, an array's every task), not from a pass over every job of the state.
    log = queue()  # job 1 (alice) runs, job 2 (bob) waits
    owners = Owners()
    owners.rebuild(log.state)
    later = [
        submitted(3, job(nodes=1, gpus=1)),
        submitted(4, job(nodes=1, gpus=1, array=parse_array("0-2")), user="bob"),  # tasks 4, 5, 6
        submitted(7, job(nodes=1, gpus=1), user="carol"),
        submitted(2, job(nodes=1, gpus=1), user="carol"),  # a duplicate id: the fold takes nothing
    ]
    for body in later:
        jobs_before = len(log.state.jobs)
        log.add(body)
        if len(log.state.jobs) > jobs_before:  # (the shell adds what the fold took)
            owners.add(
                log.state, body.user, range(body.job_id, body.job_id + len(log.state.jobs) - jobs_before)
            )
    for users in (["alice"], ["bob"], ["carol"], ["bob", "carol"], ["dave"], ["alice", "alice"]):
        request = api.JobsRequest(users=users, include_finished=True)
        by_owner = jobs_reply(log.state, Plan(), POLICY, request, T0 + 100, owners)
        assert by_owner == jobs_reply(log.state, Plan(), POLICY, request, T0 + 100), users
    shown = jobs_reply(log.state, Plan(), POLICY, api.JobsRequest(users=["bob"]), T0 + 100, owners)
    assert [j.job_id for j in shown.jobs] == [2, 4, 5, 6]


def test_a_users_forgotten_jobs_leave_the_owners_index() -> None:
    log = Log(*cluster(nodes=2))
    owners = Owners()
    owners.rebuild(log.state)
    for job_id in range(1, 201):
        log.add(submitted(job_id, job(nodes=1, gpus=1)))
        owners.add(log.state, "alice", [job_id])
    for job_id in range(1, 181):  # the state forgets them (as retention does, min_job_age after their end)
        del log.state.jobs[job_id]
    assert [j.job_id for j in owners.jobs(log.state, ["alice"])] == list(range(181, 201))
    assert len(owners._ids["alice"]) == 20
    for job_id in range(201, 301):  # no query meanwhile: the ids are pruned as they grow
        log.add(submitted(job_id, job(nodes=1, gpus=1)))
        del log.state.jobs[job_id - 20]
        owners.add(log.state, "alice", [job_id])
    assert len(owners._ids["alice"]) <= 2 * 20 + 64 + 1
    assert [j.job_id for j in owners.jobs(log.state, ["alice"])] == list(range(281, 301))


def test_live_counts_are_a_users_pending_and_running_jobs_by_qos_and_account() -> None:
    # The gateway's MaxSubmitJobs check asks for these counts at each submission of a user with a limit,
    # instead of every live job of the user as squeue sees it.
    log = queue()  # job 1 (alice, account alice) runs; job 2 (bob, account ml) waits
    log.add(submitted(3, job(nodes=1, gpus=1, qos="high")))
    log.add(submitted(4, job(nodes=1, gpus=1, account="ml")))
    log.add(submitted(5, job(nodes=1, gpus=1, account="ml")))
    log.add(submitted(6, job(nodes=1, gpus=1, array=parse_array("0-2"), account="ml")))  # tasks 6, 7, 8
    log.add(submitted(9, job(nodes=1, gpus=1)))
    log.add(ev.JobCancelled(job_id=9, attempt=-1, by="alice"))  # ended: not counted
    owners = Owners()
    owners.rebuild(log.state)
    request = api.LiveCountsRequest(user="alice")
    counted = views.live_counts_reply(log.state, POLICY, request, owners)
    default = views.job_info(log.state.jobs[1], Plan(), POLICY).qos
    assert counted.counts == sorted(
        [
            api.LiveCount(qos=default, account="alice", jobs=1),
            api.LiveCount(qos="high", account="alice", jobs=1),
            api.LiveCount(qos=default, account="ml", jobs=5),
        ],
        key=lambda c: (c.qos, c.account),
    )
    assert counted == views.live_counts_reply(log.state, POLICY, request)  # the same without the index
    # What the gateway counted before, from squeue's view of the user's live jobs, is the same.
    live = jobs_reply(log.state, Plan(), POLICY, api.JobsRequest(users=["alice"]), T0 + 100, owners).jobs
    assert sum(c.jobs for c in counted.counts) == len(live) == 7
    bob = views.live_counts_reply(log.state, POLICY, api.LiveCountsRequest(user="bob"), owners)
    assert bob.counts == [api.LiveCount(qos=default, account="ml", jobs=1)]
    assert views.live_counts_reply(log.state, POLICY, api.LiveCountsRequest(user="dave"), owners).counts == []


def test_sinfo_of_thousands_of_nodes_comes_in_pages_that_each_fit_a_message() -> None:
    # sinfo's reply held every configured node, ~280 B of JSON each: 16,000 nodes were ~4.5 MB, over the
    # decoders' 4 MiB, and building it asked each node's partitions with a pass over every partition's node
    # list (1.5 s for 10,000 nodes, 6 s for 20,000, in every scheduler). The verb now answers a page at a
    # time, by name from ``after_node`` on, under MAX_REPLY_BYTES.
    config = cluster_config(nodes=16_000)
    log = Log(*cluster(nodes=40))  # the first 40 registered, the rest not yet
    pages, after = [], ""
    while True:
        out = views.nodes_reply(log.state, config, api.NodesRequest(after_node=after), T0 + 100)
        assert len(msgspec.json.encode(out)) <= views.MAX_REPLY_BYTES + 4096
        pages.append(out)
        if not out.more:
            break
        after = out.nodes[-1].name
    assert len(pages) >= 2
    assert [n.name for p in pages for n in p.nodes] == sorted(n.name for n in config.nodes)
    assert all(p.partitions == pages[0].partitions for p in pages)
    shown = {n.name: n for p in pages for n in p.nodes}
    assert shown["gpu40"].state == "idle" and shown["gpu41"].state == "unknown"
    assert shown["cpu02"].partitions == ["cpu"] and shown["gpu16000"].partitions == ["gpu"]
    # A partition's nodes only; a page after a node no longer configured (the scheduler restarted with
    # another configuration between two pages) goes on from the next name.
    cpu = views.nodes_reply(log.state, config, api.NodesRequest(partitions=["cpu"]), T0 + 100)
    assert ([n.name for n in cpu.nodes], cpu.more) == (["cpu01", "cpu02"], False)
    gone = views.nodes_reply(log.state, config, api.NodesRequest(after_node="cpu99"), T0 + 100)
    assert [n.name for n in gone.nodes][:2] == ["gpu01", "gpu02"]
