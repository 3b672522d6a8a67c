"""What a planning cycle starts from, kept across cycles: each node's free capacity and its plan over time.

``placement.free_capacity`` builds a ``Free`` for every node in every cycle, most of them unchanged since
the last one (a cycle follows a few events: a submission, an exit, an allocation). ``CapacityCache`` keeps
the ``Free`` it built for each node with everything it was built from, and builds again only the nodes
whose registration, health or usage changed since. The cycle gets the kept ones themselves: whatever
changes one in a cycle replaces it with a copy first (``Planner._take``, ``plan._capacity``'s exits).

What it was built from is compared by value (a copy of the whole node, its lists too, against the node:
msgspec's struct ``==``, every node at once), not by identity or by a version the fold would have to keep:
whatever changes a node, and however, its ``Free`` is built again. Equal to ``free_capacity`` for every
state (``tests/unit/test_capacity_cache.py``, and the simulator's runs with and without it).

``node_plans`` keeps each node's ``NodePlan`` (its ``Free`` and the releases of the runs on it) the same way:
the cycle gives it every run's release time and allocations (computed anew each cycle, so a time limit,
a preemption or ``now`` changing one is seen), and only the nodes whose ``Free`` is another object or
whose runs' releases changed get a new plan. The planner undoes its cycle's changes to the plans it
is given (``Planner.restore``), so what is kept is always the state's.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import compress
from operator import is_not, ne

import msgspec

from corral.libs.core.job_facts import FactsCache
from corral.libs.core.partitions import Kept
from corral.libs.core.placement import Free, free_capacity, free_of
from corral.libs.core.state import Node
from corral.libs.core.timeline import INF, NodePlan, Release
from corral.schemas.events import NodeAllocation

#: What a run (a job's id, or an orphan's (job, attempt, node)) holds: its release time and allocations.
Runs = dict[Hashable, tuple[float, Sequence[NodeAllocation]]]


def _kept(node: Node) -> Node:
    """A copy of the node to compare it with later: with lists of its own, so that a list the fold changes
    in place compares unequal."""
    return msgspec.structs.replace(
        node,
        used_gpus=list(node.used_gpus),
        jobs=list(node.jobs),
        partitions=list(node.partitions),
        features=list(node.features),
    )


class CapacityCache:
    """Each node's ``Free`` as last built, with a copy of the node it was built from (``_kept``); the
    nodes' ``NodePlan`` and the releases of their runs; each pending job's ``Facts``."""

    def __init__(self) -> None:
        self._names: list[str] = []  # the state's nodes by name, in the state's order, as last seen
        self._kept: list[Node] = []  # a copy of each of them as last seen (``_kept``), in that order
        self._free: dict[str, Free] = {}  # the ``Free`` of those that are up, by name in name order
        self._runs: Runs = {}  # every run's release time and allocations (copied) as last given
        self._releases: dict[str, dict[Hashable, Release]] = {}  # node -> its runs' releases, by run
        self._plans: dict[str, NodePlan] = {}  # node -> its plan as last built
        self._names_planned: list[str] = []  # the names of ``_plans``, in its order (by name)
        self._frees: list[Free] = []  # the ``Free`` they were last given, in that order
        self._kept_views: dict[str, Kept] | None = None  # each partition's views of them (``views``)
        self.replanned = 0  # the nodes whose plan the last ``node_plans`` built or changed (every one: new)
        self.facts = FactsCache()  # each pending job's answers that depend on its spec alone

    def free_capacity(self, nodes: dict[str, Node]) -> dict[str, Free]:
        """``placement.free_capacity(nodes)``, reusing what is unchanged (by name; copy one to change it)."""
        names, values = list(nodes), list(nodes.values())
        if names != self._names:
            # Nodes came or went (or another state's): build them all again, in name order.
            self._names, self._kept = names, [_kept(n) for n in values]
            built = free_capacity(nodes)
            self._free = built
            return dict(built)
        kept, out, order = self._kept, self._free, False
        # Every node compared with its copy (struct ``==``, by value), in C; the few that differ built again.
        for i in compress(range(len(values)), map(ne, values, kept)):
            name, node = names[i], values[i]
            kept[i] = _kept(node)
            free = free_of(name, node)
            if free is None:
                order = order or name in out
                out.pop(name, None)
            else:
                order = order or name not in out
                out[name] = free
        if order:  # a node went down or came back up: keep the name order
            self._free = {name: out[name] for name in sorted(out)}
        return dict(self._free)

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
        names, frees = list(free), list(free.values())
        views = self._kept_views
        if names != self._names_planned:
            # Nodes came or went: every plan anew, in ``free``'s order (by name), which the planner's scans
            # follow; the partitions' views too.
            self._names_planned, views = names, None
            self._plans = {name: NodePlan(f, self._sorted(name)) for name, f in free.items()}
            self.replanned = len(self._plans)
        else:
            plans, self.replanned = self._plans, 0
            # The nodes whose ``Free`` is another object than last time (found in C), or whose runs changed.
            for name in dirty.union(compress(names, map(is_not, frees, self._frees))):
                plan = plans.get(name)
                if plan is None:
                    continue  # not up: it has no plan
                f = free[name]
                if name not in dirty and plan.free == f:
                    plan.free = f  # the same capacity (last cycle's was a copy given back): nothing moves
                    continue
                # Changed in place: the partitions' kept views hold the plans themselves.
                if views is not None:
                    if plan.free.partitions != f.partitions:
                        views = None
                    else:
                        for partition in f.partitions:
                            views[partition].changed(plan.free, f)
                plan.free, plan.sig = f, None
                self.replanned += 1
                if name in dirty:  # else its runs' releases are as they were
                    plan.releases = self._sorted(name)
        self._frees, self._kept_views = frees, views
        return self._plans

    def _sorted(self, name: str) -> list[Release]:
        """The releases of the runs on node ``name``, by time."""
        releases = self._releases.get(name)
        return sorted(releases.values()) if releases else []

    def views(self) -> dict[str, Kept]:
        """Each partition's views of the plans ``node_plans`` last gave (built again after a node came,
        went or changed partitions)."""
        if self._kept_views is None:
            self._kept_views = Kept.of(self._plans)
        return self._kept_views

    def _release(self, key: Hashable, allocations: Sequence[NodeAllocation], dirty: set[str]) -> None:
        """Forget what run ``key`` gave back on its nodes."""
        for alloc in allocations:
            releases = self._releases.get(alloc.node)
            if releases is not None and releases.pop(key, None) is not None:
                dirty.add(alloc.node)
