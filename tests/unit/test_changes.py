"""The fold's notes of what it changed (``changes.py``), and the capacity cache that reads them instead of
comparing every node and run: on random logs its capacity and plans equal those built by comparing
everything, cycle after cycle, without comparing again."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator

import pytest
from builders import Log, cluster, exited, job, policy, registered, submitted

from corral.libs.core import changes
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.conclude import conclude
from corral.libs.core.plan import plan
from corral.libs.core.state import State, encode_state
from corral.schemas import events as ev


def _capacity(cache: CapacityCache, state: State, resolution: int) -> tuple[object, object]:
    """What a cycle starts from, as values: every node's ``Free`` and its plan's capacity and releases."""
    _, running = conclude(state, [])
    free, plans = cache.capacity(state, running, resolution)
    return dict(free), {name: (p.free, list(p.releases)) for name, p in plans.items()}


def _event(rng: random.Random, log: Log, next_id: int) -> list[ev.Event]:
    """One of the things that happen to a cluster, at random."""
    state = log.state
    running = [j for j in state.jobs.values() if j.state == "RUNNING"]
    pending = len(state.active) - len(running)
    nodes = sorted(state.nodes)
    what = rng.randrange(11)
    if what <= 2 and pending < 8:
        limit = rng.choice([300, 600, 1800, None])
        spec = job(gpus=rng.choice([1, 2, 4]), nodes=rng.choice([1, 1, 2]), time_s=limit)
        return [submitted(next_id, spec)]
    if what <= 6 and running:
        victim = rng.choice(running)
        attempt = victim.restart_count
        if what <= 4:  # one node of the run reports it gone (the batch node's report is the run's exit)
            node = rng.choice([a.node for a in victim.allocations][:2])
            return [exited(victim.job_id, node, attempt=attempt)]
        if what == 5:  # cancelled: concluded at once, its nodes that did not report it keep orphans
            return [ev.JobCancelled(job_id=victim.job_id, attempt=attempt, by="alice", signal=15)]
        mode = "requeue"
        return [ev.JobPreempted(job_id=victim.job_id, attempt=attempt, mode=mode, grace_s=30, by_job=1)]
    name = rng.choice(nodes)
    if what <= 7:  # an orphan's node reports it gone
        orphans = state.orphans
        if orphans:
            o = rng.choice(orphans)
            return [exited(o.job_id, o.node, attempt=o.attempt)]
        return [ev.NodeUp(node=name)]
    if what == 8:
        up = state.nodes[name].up
        return [ev.NodeDown(node=name, reason="silent")] if up else [ev.NodeUp(node=name)]
    if what == 9:
        if state.nodes[name].admin_drain is None:
            return [ev.NodeDrained(node=name, reason="maintenance", by="root")]
        return [ev.NodeResumed(node=name, by="root")]
    # A re-registration that moves the node between partitions.
    partitions = rng.choice([("gpu",), ("gpu", "debug")])
    return [registered(name, gpus=4, cpus=64, partitions=partitions)]


def _happenings(rng: random.Random, log: Log, steps: int) -> Iterator[int]:
    """``steps`` random happenings folded into ``log``, seconds or a minute apart; yields after each."""
    next_id = 1
    for step in range(steps):
        bodies = _event(rng, log, next_id)
        next_id += isinstance(bodies[0], ev.JobSubmitted)
        log.add(*bodies, step=rng.choice([1.0, 30.0, 60.0]))
        yield step


@pytest.mark.parametrize("resolution", [0, 60])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_cache_that_reads_the_folds_notes_builds_what_comparing_everything_builds(
    seed: int, resolution: int
) -> None:
    log = Log(*cluster(nodes=6, gpus=4))
    following = CapacityCache()
    pol = policy()
    for step in _happenings(random.Random(seed), log, 400):
        if step % 3 == 0:
            log.decide(plan(log.state, log.at, pol).decisions)  # starts and conclusions
        assert _capacity(following, log.state, resolution) == _capacity(
            CapacityCache(follow=False), log.state, resolution
        )
    assert following.compared == 1  # its first cycle; every other one read the notes
    assert sum(isinstance(e.body, ev.JobAllocated) for _, e in log.entries) > 30
    assert any(isinstance(e.body, ev.JobCancelled) for _, e in log.entries)


def test_plans_with_a_following_cache_equal_plans_without_it() -> None:
    """Whole cycles, decisions applied between them: a following cache decides as no cache does."""
    log = Log(*cluster(nodes=5, gpus=4))
    cache = CapacityCache()
    pol = policy()
    for _ in _happenings(random.Random(5), log, 300):
        fresh = plan(log.state, log.at, pol)
        assert plan(log.state, log.at, pol, cache=cache) == fresh
        log.decide(fresh.decisions)
    assert cache.compared == 1


def test_it_compares_everything_when_it_cannot_know() -> None:
    """Another state (a copy has no journal), another resolution, a journal that started again, a node that
    came: the cache compares everything again, and builds the same."""
    log = Log(*cluster(nodes=3, gpus=4))
    log.add(submitted(1, job(gpus=4, nodes=1, time_s=600)))
    log.decide(plan(log.state, log.at, policy()).decisions)
    cache = CapacityCache()
    _capacity(cache, log.state, 0)
    _capacity(cache, log.state, 0)
    assert cache.compared == 1
    _capacity(cache, log.state, 60)
    assert cache.compared == 2
    twin = copy.copy(log.state)
    assert changes.of(twin) is None
    assert _capacity(cache, twin, 60) == _capacity(CapacityCache(follow=False), twin, 60)
    assert cache.compared == 3
    _capacity(cache, log.state, 60)  # back to the followed state: its journal is the one it last read
    assert cache.compared == 4
    journal = changes.of(log.state)
    assert journal is not None
    journal.touched(None, ["gpu01"] * changes.LIMIT)  # the journal starts again past its limit
    log.add(exited(1, log.state.jobs[1].allocations[0].node))
    assert _capacity(cache, log.state, 60) == _capacity(CapacityCache(follow=False), log.state, 60)
    assert cache.compared == 5
    log.add(registered("gpu09", gpus=4))  # a node came
    assert _capacity(cache, log.state, 60) == _capacity(CapacityCache(follow=False), log.state, 60)
    assert cache.compared == 6
    assert len(cache.capacity(log.state, [], 60)[1]) == 4


def test_a_state_nobody_follows_keeps_no_journal_and_encodes_as_before() -> None:
    log = Log(*cluster(nodes=2, gpus=4))
    assert changes.of(log.state) is None
    plan(log.state, log.at, policy())  # a plan without a cache does not follow the state
    assert changes.of(log.state) is None
    unfollowed = Log(*cluster(nodes=2, gpus=4))
    changes.follow(log.state)
    for each in (log, unfollowed):
        each.add(submitted(1, job(gpus=4, nodes=1, time_s=600)))
    journal = changes.of(log.state)
    assert journal is not None and journal.since(0) == [1]
    assert encode_state(log.state) == encode_state(unfollowed.state)  # the journal is not part of it
