"""Which cgroup a step joins: the batch node's run cgroup, or a peer's run cgroup that the run's steps
there share and the last one removes; the step's OOM marks its exits."""

from __future__ import annotations

import asyncio

import pytest
from test_jobenv import launch

from corral.schemas.api import LaunchOrder
from corral.schemas.steps import TaskExit
from corral.services.agent.step_cgroups import StepCgroup, StepCgroups

pytestmark = pytest.mark.unit


class Node:
    """A node's run cgroups by (job, attempt), as the agent's callbacks see them."""

    def __init__(self, runs: dict[tuple[int, int], str] | None = None) -> None:
        self.runs = dict(runs or {})
        self.created: list[tuple[int, int]] = []
        self.removed: list[tuple[int, int]] = []

    def cgroups(self) -> StepCgroups:
        return StepCgroups(
            run_cgroup=lambda j, a: self.runs.get((j, a)), create=self.create, remove=self.remove
        )

    def create(self, order: LaunchOrder) -> str:
        self.created.append((order.job_id, order.attempt))
        path = self.runs[(order.job_id, order.attempt)] = f"/cg/run_{order.job_id}.{order.attempt}"
        return path

    def remove(self, job_id: int, attempt: int) -> None:
        self.removed.append((job_id, attempt))
        del self.runs[(job_id, attempt)]


def two_node_order() -> LaunchOrder:
    """A run on gpu01 (its batch node) and gpu02 (a peer)."""
    return launch()


async def test_the_batch_node_joins_its_run_cgroup_and_never_removes_it() -> None:
    order = two_node_order()
    node = Node({(order.job_id, order.attempt): "/cg/run"})
    cgroups = node.cgroups()
    got = await cgroups.acquire(order, "gpu01")
    assert (got.path, got.peer) == ("/cg/run", False)
    await cgroups.release((order.job_id, order.attempt), got)
    assert node.created == [] and node.removed == []


async def test_a_peer_makes_one_cgroup_for_the_runs_steps_and_the_last_removes_it() -> None:
    order = two_node_order()
    node = Node()
    cgroups = node.cgroups()
    key = (order.job_id, order.attempt)
    first, second = await asyncio.gather(cgroups.acquire(order, "gpu02"), cgroups.acquire(order, "gpu02"))
    assert first.path == second.path == f"/cg/run_{key[0]}.{key[1]}" and first.peer and second.peer
    assert node.created == [key]  # one for both steps
    await cgroups.release(key, first)
    assert node.removed == []
    await cgroups.release(key, second)
    assert node.removed == [key]
    # The run's next step makes it again.
    third = await cgroups.acquire(order, "gpu02")
    assert third.peer and node.created == [key, key]


async def test_an_unconfined_peer_has_no_cgroup() -> None:
    order = two_node_order()
    cgroups = StepCgroups(run_cgroup=lambda j, a: None, create=lambda o: None, remove=lambda j, a: None)
    got = await cgroups.acquire(order, "gpu02")
    assert (got.path, got.peer) == (None, False)


def test_exits_without_a_cgroup_are_not_oom() -> None:
    exits = [TaskExit(task=0, node="gpu02", exit_code=0, signal=9)]
    assert StepCgroups.with_oom(StepCgroup(None, False), exits) == exits
