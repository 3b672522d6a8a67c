"""Which memory cgroup a step's tasks join on this node, and when a peer's one goes.

On the batch node a step's tasks join the run's cgroup, which the run's supervisor owns (confine.py). A
peer node (any other node of the job) runs no batch script, so it has no run cgroup: the first step of a
run that has tasks here creates one for the run, limited to the run's memory on this node (the same
rule), and the last of the run's steps to end here removes it — so every node of a multi-node job is
confined, and all steps of a run on a node share one limit, as in Slurm. Users are counted under a lock
per run, so a step that starts while the previous one's cgroup is being removed never joins a dying one.

The OOM killer's count in the cgroup (``memcg.oom_count``) tells whether the step's tasks here met an OOM
kill: their exits then say ``oom`` (the step ends OUT_OF_MEMORY, and so does the job).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from corral.schemas.api import LaunchOrder
from corral.schemas.steps import TaskExit
from corral.services.agent import memcg

RunKey = tuple[int, int]


@dataclass
class StepCgroup:
    """The cgroup a step's tasks on this node joined."""

    path: str | None  # the cgroup (None: the tasks run unconfined)
    peer: bool  # a peer's run cgroup, which the run's steps here share and the last one removes
    oom_base: int = 0  # its OOM kill count when the step started


@dataclass
class StepCgroups:
    """The step side of this node's memory cgroups."""

    run_cgroup: Callable[[int, int], str | None]  # (job, attempt) -> the run's cgroup here, if it exists
    create: Callable[[LaunchOrder], str | None]  # make a run cgroup on this node for the order; None: none
    remove: Callable[[int, int], object]  # remove (killing what is left) the run's cgroup on this node
    users: dict[RunKey, int] = field(default_factory=dict)  # live steps of each peer run cgroup
    # A lock per run over its users, creation and removal: a removal (which may wait for the cgroup to
    # empty) never holds up another run's steps. Kept for the agent's life (a few bytes per run).
    locks: dict[RunKey, asyncio.Lock] = field(default_factory=dict)

    async def acquire(self, order: LaunchOrder, node: str) -> StepCgroup:
        """The cgroup for a new step of the order's run on ``node`` (created on a peer if need be)."""
        key = (order.job_id, order.attempt)
        peer = bool(order.allocations) and order.allocations[0].node != node
        async with self.locks.setdefault(key, asyncio.Lock()):
            path = self.run_cgroup(*key)
            if path is None and peer:
                path = await asyncio.to_thread(self.create, order)
            if peer and path is not None:
                self.users[key] = self.users.get(key, 0) + 1
        return StepCgroup(path, peer and path is not None, _count(path))

    def adopted(self, key: RunKey, path: str | None, peer: bool, oom_base: int) -> StepCgroup:
        """The cgroup of a step taken up after an agent restart; ``oom_base`` is its count when the step
        started (kept in the step's spec), so an OOM kill while the agent was down still counts."""
        if peer and path is not None:
            self.users[key] = self.users.get(key, 0) + 1
        return StepCgroup(path, peer and path is not None, oom_base)

    async def release(self, key: RunKey, cgroup: StepCgroup) -> None:
        """A step of the run ended here: the last one removes a peer's run cgroup."""
        if not cgroup.peer:
            return
        async with self.locks.setdefault(key, asyncio.Lock()):
            self.users[key] = self.users.get(key, 1) - 1
            if self.users[key] > 0:
                return
            del self.users[key]
            await asyncio.to_thread(self.remove, *key)

    @staticmethod
    def with_oom(cgroup: StepCgroup, exits: list[TaskExit]) -> list[TaskExit]:
        """The exits, marked ``oom`` if the cgroup counted an OOM kill since the step started (as Slurm
        does, whatever the task's own status: a shell that survives its OOM-killed child exits 0)."""
        if cgroup.path is None or not exits:
            return exits
        count = memcg.oom_count(cgroup.path)
        if count is None or count <= cgroup.oom_base:
            return exits
        return [msgspec.structs.replace(e, oom=True) for e in exits]


def _count(path: str | None) -> int:
    return (memcg.oom_count(path) or 0) if path is not None else 0
