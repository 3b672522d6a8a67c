"""``CapacityCache``: the nodes' free capacity kept from cycle to cycle equals ``free_capacity`` built anew,
whatever changed a node and however (a list changed in place too), and no cycle changes what it keeps."""

from __future__ import annotations

import dataclasses
import random

import pytest
from builders import Log, cluster, exited, job, policy, submitted

from corral.libs.core.capacity import CapacityCache
from corral.libs.core.partitions import Kept
from corral.libs.core.placement import free_capacity
from corral.libs.core.plan import plan
from corral.libs.core.policy import Backfill
from corral.libs.core.state import AdminDrain, Node
from corral.schemas import events as ev


def _nodes() -> dict[str, Node]:
    return {
        f"n{i}": Node(
            name=f"n{i}", cpus=16, mem_mb=64_000, gpus=4, gpu_type="h100", partitions=["gpu"], features=[]
        )
        for i in range(6)
    }


def _change(rng: random.Random, node: Node) -> None:
    """One of the ways the fold changes a node (new lists, or a list changed in place)."""
    what = rng.randrange(8)
    if what == 0:
        free = [g for g in range(node.gpus) if g not in node.used_gpus]
        if free:
            node.used_gpus = sorted([*node.used_gpus, rng.choice(free)])
    elif what == 1 and node.used_gpus:
        node.used_gpus.pop(rng.randrange(len(node.used_gpus)))  # in place
    elif what == 2:
        node.alloc_cpus = rng.randrange(node.cpus + 1)
    elif what == 3:
        node.alloc_mem_mb = rng.randrange(0, node.mem_mb + 1, 1000)
    elif what == 4:
        node.up = not node.up
    elif what == 5:
        node.admin_drain = None if node.admin_drain else AdminDrain(reason="r", by="root", at=1.0)
    elif what == 6:
        node.features.append(f"f{rng.randrange(3)}")  # in place
    elif node.jobs:
        node.jobs.clear()  # in place
    else:
        node.jobs.append(rng.randrange(100))  # in place


def test_the_cache_equals_free_capacity_through_random_changes() -> None:
    rng = random.Random(7)
    nodes = _nodes()
    cache = CapacityCache()
    for _ in range(2000):
        for _ in range(rng.randrange(3)):
            _change(rng, rng.choice(list(nodes.values())))
        if rng.random() < 0.02:
            name = f"n{rng.randrange(9)}"  # a node registered, or gone
            if name in nodes and rng.random() < 0.5:
                del nodes[name]
            else:
                nodes[name] = Node(
                    name=name, cpus=8, mem_mb=1000, gpus=2, gpu_type=None, partitions=["cpu"], features=[]
                )
        assert cache.free_capacity(nodes) == free_capacity(nodes)


def test_cycles_with_the_cache_decide_as_without_and_leave_it_as_built() -> None:
    """A run of cycles (starts, exits, requeues on a down node) with one cache: each plan equals a plan made
    without it, and what the cache keeps still equals ``free_capacity`` after each (no cycle changed it)."""
    rng = random.Random(3)
    log = Log(*cluster(nodes=4, gpus=4))
    cache = CapacityCache()
    pol = policy()
    for job_id in range(1, 40):
        log.add(submitted(job_id, job(gpus=rng.choice([1, 2, 4]), nodes=rng.choice([1, 1, 2]), time_s=600)))
        for running in [j for j in log.state.jobs.values() if j.state == "RUNNING"]:
            if rng.random() < 0.4:
                log.add(
                    *(
                        exited(running.job_id, a.node, attempt=running.restart_count)
                        for a in running.allocations
                    )
                )
        if job_id == 20:
            log.add(ev.NodeDown(node="gpu02", reason="test"))
        fresh = plan(log.state, log.at, pol)
        cached = plan(log.state, log.at, pol, cache=cache)
        assert cached == fresh
        assert cache.free_capacity(log.state.nodes) == free_capacity(log.state.nodes)
        log.decide(cached.decisions)
    assert any(isinstance(d, ev.JobAllocated) for _, e in log.entries for d in [e.body])


@pytest.mark.parametrize(
    ("backfill", "resolution"),
    [("easy", 0), ("conservative", 0), ("easy", 60), ("fifo", 0)],
    ids=["easy", "conservative", "easy-resolution-60", "fifo"],
)
def test_node_plans_kept_across_cycles_decide_as_built_anew(backfill: Backfill, resolution: int) -> None:
    """The nodes' plans (capacity and releases) kept in the cache, with runs starting, ending, lost with a
    node, an unlimited one, an advance reservation and the same state planned twice: every plan with the
    cache equals the plan made without it (so the cycles' holds and tentative starts were undone)."""
    rng = random.Random(11)
    log = Log(*cluster(nodes=5, gpus=4))
    cache = CapacityCache()
    pol = dataclasses.replace(policy(), backfill=backfill, backfill_resolution_s=resolution)
    for job_id in range(1, 60):
        limit = rng.choice([300, 600, 1800, None])
        spec = job(gpus=rng.choice([1, 2, 4]), nodes=rng.choice([1, 1, 2, 3]), time_s=limit)
        log.add(submitted(job_id, spec), step=rng.choice([1.0, 30.0, 200.0]))
        for running in [j for j in log.state.jobs.values() if j.state == "RUNNING"]:
            if rng.random() < 0.3:
                nodes = [a.node for a in running.allocations]
                log.add(*(exited(running.job_id, n, attempt=running.restart_count) for n in nodes))
        if job_id == 15:
            log.add(ev.NodeDown(node="gpu03", reason="test"))
        if job_id == 25:
            log.add(ev.NodeUp(node="gpu03"))
        if job_id == 30:
            at = log.at + 900
            log.add(ev.ReservationCreated(name="r", start_time=at, end_time=at + 3600, nodes=["gpu01"]))
        fresh = plan(log.state, log.at, pol)
        assert plan(log.state, log.at, pol, cache=cache) == fresh
        _assert_views_as_built(cache, log.state.nodes)
        assert plan(log.state, log.at, pol, cache=cache) == fresh  # the same state again: nothing left over
        log.decide(fresh.decisions)
    assert sum(isinstance(e.body, ev.JobAllocated) for _, e in log.entries) > 20


def _assert_views_as_built(cache: CapacityCache, nodes: dict[str, Node]) -> None:
    """The partitions' views the cache keeps (updated node by node) equal views built anew from its plans,
    which no cycle left a hold on, and hold every node of their partition that is up."""
    views = cache.views()
    plans = {n.free.name: n for k in views.values() for n in k.members}
    assert all(not n.held() for n in plans.values())
    anew = Kept.of(dict(sorted(plans.items())))
    assert views.keys() == anew.keys()
    for name, view in views.items():
        up = [f.name for f in free_capacity(nodes).values() if name in f.partitions]
        assert [n.free.name for n in view.members] == [n.free.name for n in anew[name].members] == up
        assert (view.cpus, view.gpus, view.keys) == (anew[name].cpus, anew[name].gpus, anew[name].keys)


@pytest.mark.parametrize("resolution", [0, 60])
def test_a_cycle_that_only_the_clock_moved_builds_no_node_plan_again(resolution: int) -> None:
    """The nodes' plans are kept across cycles: a cycle seconds after the last, with nothing folded between
    them, builds none of them again, also once the runs are past their time limit and not yet seen to end; one
    after an exit builds only the nodes of that run (with a resolution too: the runs' ends are planned on a
    grid fixed in time, not counted from the plan's time)."""
    log = Log(*cluster(nodes=4, gpus=4))
    for job_id in range(1, 5):
        log.add(submitted(job_id, job(gpus=4, nodes=1, time_s=3600)))
    pol = dataclasses.replace(policy(), backfill_resolution_s=resolution)
    log.decide(plan(log.state, log.at, pol).decisions)
    cache = CapacityCache()
    plan(log.state, log.at, pol, cache=cache)
    assert cache.replanned == 4  # the first cycle builds every node's
    for dt in (1.0, 7.0, 45.0, 4000.0, 4001.0):  # the runs' limit is an hour
        plan(log.state, log.at + dt, pol, cache=cache)
        assert cache.replanned == 0
    gone = log.state.jobs[2].allocations[0].node
    log.add(exited(2, gone))
    plan(log.state, log.at + 4002, pol, cache=cache)
    assert cache.replanned == 1
