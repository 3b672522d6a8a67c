"""What a planning cycle starts from, kept across cycles: each node's free capacity and its plan over time.

``placement.free_capacity`` builds a ``Free`` for every node in every cycle, most of them unchanged since
the last one (a cycle follows a few events: a submission, an exit, an allocation). ``CapacityCache`` keeps
the ``Free`` it built for each node with everything it was built from, and builds again only the nodes
whose registration, health or usage changed since. The cycle gets the kept ones themselves: whatever
changes one in a cycle replaces it with a copy first (``Planner._take``, ``plan._capacity``'s exits).

What it was built from is compared by value (the node's lists too), not by identity or by a version the
fold would have to keep: whatever changes a node, and however, its ``Free`` is built again. Equal to
``free_capacity`` for every state (``tests/unit/test_capacity_cache.py``, and the simulator's runs with and
without it).

``node_plans`` keeps each node's ``NodePlan`` (its ``Free`` and the releases of the runs on it) the same way:
the cycle gives it every run's release time and allocations (computed anew each cycle, so a time limit,
a preemption or ``now`` changing one is seen), and only the nodes whose ``Free`` is another object or
whose runs' releases changed get a new plan. The planner undoes its cycle's changes to the plans it
is given (``Planner.restore``), so what is kept is always the state's.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from corral.libs.core.job_facts import FactsCache
from corral.libs.core.placement import Free, free_capacity
from corral.libs.core.state import Node
from corral.libs.core.timeline import INF, NodePlan, Release
from corral.schemas.events import NodeAllocation

#: What a node's ``Free`` is built from: its fields that ``free_capacity`` reads (``jobs`` as a flag).
Basis = tuple[object, ...]
#: What a run (a job's id, or an orphan's (job, attempt, node)) holds: its release time and allocations.
Runs = dict[Hashable, tuple[float, Sequence[NodeAllocation]]]


def _basis(node: Node) -> Basis:
    return (
        node.up,
        node.drain,
        node.admin_drain,
        node.cpus,
        node.alloc_cpus,
        node.mem_mb,
        node.alloc_mem_mb,
        node.gpus,
        node.gpu_type,
        not node.jobs,
        node.used_gpus,
        node.partitions,
        node.features,
    )


class CapacityCache:
    """Each node's ``Free`` as last built, with its basis (lists copied, so that a list the fold changes in
    place still compares unequal)."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[Basis, Free | None]] = {}  # node -> (basis, Free or None: not up)
        self._runs: Runs = {}  # every run's release time and allocations (copied) as last given
        self._releases: dict[str, dict[Hashable, Release]] = {}  # node -> its runs' releases, by run
        self._plans: dict[str, NodePlan] = {}  # node -> its plan as last built
        self.facts = FactsCache()  # each pending job's answers that depend on its spec alone

    def free_capacity(self, nodes: dict[str, Node]) -> dict[str, Free]:
        """``placement.free_capacity(nodes)``, reusing what is unchanged (by name; copy one to change it)."""
        built = self._built
        if len(built) > 2 * len(nodes) + 16:
            built.clear()  # nodes removed (or another state's): forget them
        out: dict[str, Free] = {}
        for name in sorted(nodes):
            node = nodes[name]
            basis = _basis(node)
            entry = built.get(name)
            if entry is None or entry[0] != basis:
                free = free_capacity({name: node}).get(name)
                kept = (*basis[:-3], list(node.used_gpus), list(node.partitions), list(node.features))
                entry = built[name] = (kept, free)
            if entry[1] is not None:
                out[name] = entry[1]
        return out

    def node_plans(self, free: dict[str, Free], runs: Runs) -> dict[str, NodePlan]:
        """Each node of ``free`` with its runs' releases (``runs``: every run that holds resources), reusing
        the plans whose ``Free`` is the same object and whose releases are unchanged."""
        dirty: set[str] = set()  # nodes whose releases changed
        kept = self._runs
        for key, (when, allocations) in runs.items():
            was = kept.get(key)
            if was is not None and was[0] == when and was[1] == allocations:
                continue
            if was is not None:
                self._release(key, was[1], dirty)
            kept[key] = (when, list(allocations))
            if when < INF:
                for alloc in allocations:
                    self._releases.setdefault(alloc.node, {})[key] = Release(
                        when, alloc.cpus, len(alloc.gpus), alloc.mem_mb
                    )
                    dirty.add(alloc.node)
        if len(kept) > len(runs):
            for key in [k for k in kept if k not in runs]:
                self._release(key, kept.pop(key)[1], dirty)
        plans, added = self._plans, False
        for name, f in free.items():
            plan = plans.get(name)
            if plan is None or plan.free is not f or name in dirty:
                added = added or plan is None
                releases = self._releases.get(name)
                plans[name] = NodePlan(f, sorted(releases.values()) if releases else [])
        if added or len(plans) != len(free):
            # A node came or went: keep ``free``'s order (by name), which the planner's scans follow.
            plans = self._plans = {name: plans[name] for name in free}
        return plans

    def _release(self, key: Hashable, allocations: Sequence[NodeAllocation], dirty: set[str]) -> None:
        """Forget what run ``key`` gave back on its nodes."""
        for alloc in allocations:
            releases = self._releases.get(alloc.node)
            if releases is not None and releases.pop(key, None) is not None:
                dirty.add(alloc.node)
