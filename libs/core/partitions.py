"""The planner's views of each partition's nodes: its members, its free totals, its best-fit index and its
nodes in groups of the same state, for one cycle (``Partitions``), and the part of them that is kept from
one cycle to the next (``Kept``).

A cycle starts from the nodes' plans the ``CapacityCache`` keeps (``capacity.py``), which have no holds
then (the planner undoes its cycle's, ``Planner.restore``). What a partition's views are at that moment
depends on its nodes' free capacity alone: its members (by name), its free CPUs and GPUs, and the
best-fit order of its nodes (none is held yet). ``Kept`` keeps those across cycles, updated by the cache
for each node whose plan changed (``Kept.changed``: its totals, and its place in the order if its key
moved) and built again when a node comes, goes or changes partitions. A cycle starts its views as copies
of them (a list copy and two integers per partition) instead of building them from every node, and
changes its copies as it decides (``taken``, ``held``); the kept ones never see the cycle's changes.
Without a cache, or for a partition an advance reservation holds nodes of (``reservations.hold`` changes
them before any view is used), the views are built from the nodes on first use, as they always were.
"""

from __future__ import annotations

import bisect

import msgspec

from corral.libs.core.placement import Free
from corral.libs.core.timeline import BestFit, NodePlan, Signature, node_state
from corral.schemas.events import NodeAllocation

#: A node's place in best-fit order (``NodePlan.key``): free GPUs, free CPUs, name.
Key = tuple[int, int, str]


class Totals(msgspec.Struct, gc=False):
    """The free capacity of a partition now, kept current as the cycle starts jobs."""

    cpus: int  # free CPUs
    gpus: int  # free GPUs


class Kept:
    """One partition's views at the start of a cycle, kept across cycles (the module docstring)."""

    def __init__(self, members: list[NodePlan]) -> None:
        self.members = members  # its nodes, by name (the cache's plans: updated in place, never replaced)
        self.cpus = sum(n.free.cpus for n in members)  # free CPUs
        self.gpus = sum(len(n.free.gpus) for n in members)  # free GPUs
        self.keys: list[Key] = sorted(n.key() for n in members)  # best-fit order (no node is held)

    def changed(self, before: Free, after: Free) -> None:
        """A member's free capacity went from ``before`` to ``after``."""
        self.cpus += after.cpus - before.cpus
        self.gpus += len(after.gpus) - len(before.gpus)
        old, new = (len(before.gpus), before.cpus, before.name), (len(after.gpus), after.cpus, after.name)
        if old != new:
            keys = self.keys
            del keys[bisect.bisect_left(keys, old)]
            bisect.insort(keys, new)

    @staticmethod
    def of(plans: dict[str, NodePlan]) -> dict[str, Kept]:
        """Every partition's views, from the nodes' plans (in name order)."""
        members: dict[str, list[NodePlan]] = {}
        for plan in plans.values():
            for name in plan.free.partitions:
                members.setdefault(name, []).append(plan)
        return {name: Kept(nodes) for name, nodes in members.items()}


class Partitions:
    """Each partition's views for one cycle (the module docstring): started from ``kept`` when given,
    else built from ``nodes`` on first use; changed as the cycle takes capacity and holds nodes."""

    def __init__(self, nodes: dict[str, NodePlan], kept: dict[str, Kept] | None = None) -> None:
        self.nodes = nodes  # every up node's plan, by name
        self.members: dict[str, list[NodePlan]] = {}  # partition -> its nodes, by name
        self.totals: dict[str, Totals] = {}  # partition -> its free CPUs and GPUs now
        self.index: dict[str, BestFit] = {}  # partition -> its nodes in best-fit order, the held apart
        self.groups: dict[str, list[list[NodePlan]]] = {}  # partition -> its nodes by ``node_state``
        for name, k in (kept or {}).items():
            self.members[name] = k.members
            self.totals[name] = Totals(k.cpus, k.gpus)
            self.index[name] = BestFit.of_keys(list(k.keys))

    def members_of(self, partition: str) -> list[NodePlan]:
        """Nodes of a partition that are up, by name."""
        if partition not in self.members:
            self.members[partition] = [n for n in self.nodes.values() if partition in n.free.partitions]
        return self.members[partition]

    def totals_of(self, partition: str) -> Totals:
        """The free CPUs and GPUs of a partition now."""
        if partition not in self.totals:
            nodes = self.members_of(partition)
            self.totals[partition] = Totals(
                sum(n.free.cpus for n in nodes), sum(len(n.free.gpus) for n in nodes)
            )
        return self.totals[partition]

    def index_of(self, partition: str) -> BestFit:
        """The partition's nodes as ``start_now`` scans them (``BestFit``)."""
        if partition not in self.index:
            self.index[partition] = BestFit(self.members_of(partition))
        return self.index[partition]

    def groups_of(self, partition: str) -> list[list[NodePlan]]:
        """The partition's nodes in groups of the same state (``node_state``), kept until one changes."""
        groups = self.groups.get(partition)
        if groups is None:
            by_state: dict[Signature, list[NodePlan]] = {}
            for node in self.members_of(partition):
                by_state.setdefault(node.sig or node_state(node), []).append(node)
            groups = self.groups[partition] = list(by_state.values())
        return groups

    def taken(self, node: NodePlan, before: Key, alloc: NodeAllocation) -> None:
        """``alloc`` was taken from ``node`` (its key was ``before``): its place, its partitions' totals."""
        partitions = node.free.partitions
        if not node.held():
            after = node.key()
            for name, index in self.index.items():
                if name in partitions:
                    index.remove(before)
                    bisect.insort(index.keys, after)
        for name, totals in self.totals.items():
            if name in partitions:
                totals.cpus -= alloc.cpus
                totals.gpus -= len(alloc.gpus)

    def held(self, groups: list[list[NodePlan]], partition: str) -> None:
        """The nodes of ``groups`` (each group's in one state), which had no holds, have one now (a planned
        start in ``partition``): each index they are in moves them to its held part. The reserving
        partition's index, if none of its nodes was held before, has these groups as its held ones."""
        for name, index in self.index.items():
            mine = (
                groups if name == partition else [[n for n in g if name in n.free.partitions] for g in groups]
            )
            gone = {n.free.name for g in mine for n in g}
            if not gone:
                continue
            first = not index.held
            if len(gone) > 8:  # one pass instead of a search per node
                index.keys = [k for k in index.keys if k[2] not in gone]
            else:
                for n in (n for g in mine for n in g):
                    index.remove(n.key())
            for g in mine:
                for n in g:
                    index.held[n.free.name] = n
            if first and name == partition:
                index.groups = list(groups)

    def forget(self, partitions: tuple[str, ...], held: bool) -> None:
        """A node of these partitions changes state: their groups of nodes in the same state go, and their
        indexes' groups of held nodes too if it is ``held`` (only held nodes are in those)."""
        if held:
            for name, index in self.index.items():
                if name in partitions:
                    index.groups = None
        for name in partitions:
            self.groups.pop(name, None)

    def unseed(self, partitions: tuple[str, ...]) -> None:
        """A node of these partitions gets holds before the cycle decides anything (an advance
        reservation): their indexes are built again on first use, from the nodes as they are then."""
        for name in partitions:
            self.index.pop(name, None)
