"""Backfill planning: start jobs now without delaying the jobs that hold reservations.

One loop serves FIFO, EASY and conservative backfill; only the reservation depth differs
(flux-sched's queue policies do the same):

- ``fifo``: the first job of a partition that cannot start blocks every job behind it;
- ``easy``: the first blocked job of each partition gets a reservation (the earliest time enough
  nodes are free, from the time limits of what runs), later jobs start now only if they do not
  delay it (Mu'alem & Feitelson's EASY);
- ``conservative``: every blocked job gets a reservation, in queue order.

The plan works per node on counts (CPUs, GPUs, memory): a running job or a job started in this
cycle gives its resources back at ``start + time limit`` (never, if unlimited); a reservation holds
resources over ``[start, start + limit)``. Exact GPU indices are chosen only when a job starts now.
With a resolution (Slurm's bf_resolution) a job's end, running or started now, is planned at the next point
of a grid fixed in time (``timeline.release_at``) and a reservation's time limit is rounded
up to a multiple of it, so ends fall on a few distinct times.

Advance reservations (``reservations.py``) are holds too, kept apart in ``NodePlan.resv`` with their name:
every job sees them except the members of that reservation (``exempt``), which ``start_in`` places on
its nodes only.

Which nodes: a reservation prefers nodes that are busy now, leaving what is free now to backfill;
a job started now prefers nodes whose free capacity is reserved later, after it ends (it fills a
hole), over capacity nobody reserved (which a longer job could use). With one-unit nodes this is
exactly EASY's "shadow time and extra processors" rule. With topology blocks configured, the
blocks come first (``topology.choose``: fewest blocks, best fit, ``--switches``, ``--segment``), and
these preferences order the nodes within a block; a reservation obeys the same rules.
"""

from __future__ import annotations

import bisect
import copy
from operator import attrgetter

import msgspec

from corral.libs.core.partitions import Kept, Partitions, Totals
from corral.libs.core.placement import Free, Request, need, node_fits, take
from corral.libs.core.timeline import (
    BestFit,
    Hold,
    NodePlan,
    Profiles,
    Release,
    Signature,
    node_state,
    openings,
    release_at,
)
from corral.libs.core.topology import Blocks, Topology, choose
from corral.schemas.events import NodeAllocation


class Planner:
    """Capacity of every node over time, for one cycle.

    ``start_now`` finds nodes through a per-partition index (``BestFit``) instead of checking every node:
    the nodes without holds in best-fit order, scanned from the request's (GPUs, CPUs) up and stopped once
    enough fit, and the nodes with holds checked in full. The nodes it picks are the ones a full scan,
    sorted by (fills a hole, free GPUs, free CPUs, name), would pick. Holds are added by ``reserve`` (which
    moves the node to the held part of the index) or, for advance reservations, before the first
    ``start_now`` of the cycle.
    """

    def __init__(
        self,
        free: dict[str, Free],
        now: float,
        blocks: Blocks | None = None,
        resolution: int = 0,
        nodes: dict[str, NodePlan] | None = None,
        undo: bool = False,
        kept: dict[str, Kept] | None = None,
    ) -> None:
        self.now = now
        self.resolution = resolution  # bf_resolution: run ends are planned on this grid (0: exact)
        self.topology = Topology.of(blocks or {})  # node -> block (``topology.py``)
        # Each node's plan: given (``capacity.CapacityCache.node_plans``), or built from ``free`` with no
        # releases. With ``undo`` (plans kept across cycles) the cycle's changes to them are undone by
        # ``restore``: what each node was before its first change is kept, by name. ``kept``: the
        # partitions' views as these plans are (``partitions.Kept``), to start this cycle's from.
        self.nodes = nodes if nodes is not None else {name: NodePlan(f) for name, f in free.items()}
        self._undo = undo
        self._saved: dict[str, tuple[NodePlan, Free, list[Release], list[Hold], list[Hold], Signature]] = {}
        # Holds of nodes with no CPU free now, not yet put on them (``_hold``): (nodes, request, from, until).
        self._deferred: list[tuple[list[NodePlan], Request, float, float]] = []
        self.views = Partitions(self.nodes, kept)  # each partition's members, totals, index and groups
        # (partition, per-node shape) -> how many nodes could host it when last counted. Free capacity
        # only shrinks during a pass, so that count stays an upper bound: a request for more nodes of the
        # same shape fails without a scan (most of a long queue is a few shapes).
        self._fitting: dict[tuple[str, Request], int] = {}
        # (partition, per-node shape) -> (end, nodes) of requests that fitted now but not around the
        # reservations. Holds only grow and capacity only shrinks during a pass, so a request of that
        # shape ending no earlier and wanting no fewer nodes cannot fit either.
        self._blocked: dict[tuple[str, Request], list[tuple[float, int]]] = {}
        self._member_gpus: dict[tuple[str, str], int] = {}  # (reservation, node) -> GPUs its members took
        self._profiles = Profiles(now)  # each held node state's free capacity over time (``reserve``)

    def running(self, allocation: list[NodeAllocation], end: float) -> None:
        """A run that holds ``allocation`` until ``end`` (INF if unlimited)."""
        self._settle()
        when = release_at(end, self.resolution)
        for alloc in allocation:
            node = self.nodes.get(alloc.node)
            if node is not None:
                self._changed(node)
                node.release(when, alloc)

    def members(self, partition: str) -> list[NodePlan]:
        """Nodes of a partition that are up, by name."""
        return self.views.members_of(partition)

    def nodes_of(self, partition: str) -> list[str]:
        """Names of the up nodes of a partition."""
        return [n.free.name for n in self.members(partition)]

    def totals(self, partition: str) -> Totals:
        """The free CPUs and GPUs of a partition now (kept up to date as jobs start)."""
        return self.views.totals_of(partition)

    def start_now(self, partition: str, req: Request, limit: float) -> list[NodeAllocation] | None:
        """Allocate ``req`` now if it fits without breaking a reservation; None otherwise. ``limit``: its
        exact time limit (INF: none); it is planned to end where every later cycle plans its run's end
        (``release_at``), so the planned starts behind it do not move once it runs."""
        if req.cpus < 1:
            self._settle()  # it could start on a node with no CPU free: that node's holds count
        totals = self.totals(partition)
        if req.nodes * req.cpus > totals.cpus or req.nodes * req.gpus > totals.gpus:
            return None  # not even the partition's whole free capacity is enough: skip the node scan
        shape = (partition, msgspec.structs.replace(req, nodes=0))
        if self._fitting.get(shape, req.nodes) < req.nodes:
            return None
        end = release_at(self.now + limit, self.resolution)
        if any(end >= e and req.nodes >= n for e, n in self._blocked.get(shape, ())):
            return None
        if self._indexed(req):
            return self._start_indexed(partition, shape, req, end)
        fit = [n for n in self.members(partition) if node_fits(n.free, req)]
        self._fitting[shape] = len(fit)
        if len(fit) < req.nodes:
            return None
        fit = [n for n in fit if n.fits_during(req, self.now, end)]
        fit.sort(key=lambda n: (not n.fills_hole(end), len(n.free.gpus), n.free.cpus, n.free.name))
        picked = choose(fit, req, self.topology, _free) if len(fit) >= req.nodes else None
        if picked is None:
            self._blocked.setdefault(shape, []).append((end, req.nodes))
            return None
        return self._take(picked, req, end)

    def _indexed(self, req: Request) -> bool:
        """Whether ``start_now`` may use the index: no topology and no node list, so that the choice is
        simply the first nodes in preference order."""
        return (
            not self.topology.blocks
            and not req.nodelist
            and req.segment <= 1
            and (req.switches is None or req.switches >= req.nodes)
        )

    def _start_indexed(
        self, partition: str, shape: tuple[str, Request], req: Request, end: float
    ) -> list[NodeAllocation] | None:
        """``start_now`` through the partition's index (see the class docstring)."""
        index: BestFit = self.views.index_of(partition)
        fillers: list[tuple[tuple[int, int, str], NodePlan]] = []  # held nodes it fits, filling a hole
        others: list[tuple[tuple[int, int, str], NodePlan]] = []  # held nodes it fits, not filling one
        fit_now = 0  # nodes it fits now, whatever the holds say
        for group in [[n] for n in index.held.values()] if req.exclude else index.held_groups():
            node = group[0]
            if node_fits(node.free, req):
                fit_now += len(group)
                if node.fits_during(req, self.now, end):
                    (fillers if node.fills_hole(end) else others).extend((n.key(), n) for n in group)
        fillers.sort(key=lambda r: r[0])
        others.sort(key=lambda r: r[0])
        chosen = [n for _, n in fillers[: req.nodes]]
        # The plain nodes (no holds: fitting now means fitting throughout) merge with ``others`` in
        # best-fit order; nodes with fewer free GPUs than the request, or as many and fewer free CPUs,
        # come first and cannot fit.
        keys, nodes, j = index.keys, self.nodes, 0
        i = bisect.bisect_left(keys, (req.gpus, req.cpus))
        if len(keys) - i + fit_now < req.nodes:
            # Too few nodes could fit, even all the plain nodes from here: a bound for the shape, no scan.
            self._fitting[shape] = len(keys) - i + fit_now
            return None
        while len(chosen) < req.nodes and i < len(keys):
            node = nodes[keys[i][2]]
            i += 1
            if not node_fits(node.free, req):
                continue
            while j < len(others) and others[j][0] < keys[i - 1] and len(chosen) < req.nodes:
                chosen.append(others[j][1])
                j += 1
            if len(chosen) < req.nodes:
                chosen.append(node)
        chosen.extend(n for _, n in others[j : j + req.nodes - len(chosen)])
        if len(chosen) < req.nodes:
            # Every plain node that could host it was seen: remember why it failed, as the full scan does.
            plain = len(chosen) - len(fillers) - len(others)
            if plain + fit_now < req.nodes:
                self._fitting[shape] = plain + fit_now
            else:
                self._blocked.setdefault(shape, []).append((end, req.nodes))
            return None
        return self._take(chosen, req, end)

    def _take(self, picked: list[NodePlan], req: Request, end: float) -> list[NodeAllocation]:
        """Allocate ``req`` on the picked nodes now, until ``end``."""
        out = []
        changed: set[tuple[tuple[str, ...], bool]] = set()  # (partitions, held) of the nodes: ``_changed``
        for node in sorted(picked, key=_name):
            changed.add((node.free.partitions, node.held()))
            self._save(node)
            before = node.key()
            node.free = copy.copy(node.free)  # it may be the cycles' shared one (``capacity.py``)
            alloc = take(node.free, req)
            self.views.taken(node, before, alloc)
            node.release(end, alloc)
            out.append(alloc)
        for partitions, held in changed:  # their groups go once, not once per node
            self.views.forget(partitions, held)
        return out

    def started_in(self, resv: str, node: str) -> int:
        """GPUs the members of reservation ``resv`` took on ``node`` in this cycle."""
        return self._member_gpus.get((resv, node), 0)

    def start_in(
        self, resv: str, nodes: list[str], req: Request, limit: float, caps: dict[str, int] | None
    ) -> list[NodeAllocation] | None:
        """Allocate a member job of reservation ``resv`` now on its ``nodes``; None if it does not fit.
        ``limit``: its exact time limit, as ``start_now``'s.

        It does not see its own reservation's hold; ``caps`` (a GPU reservation) bounds the GPUs it may
        take on each node, and what it takes comes off that reservation's hold for outsiders.
        """
        self._settle()
        end = release_at(self.now + limit, self.resolution)
        fit = [
            self.nodes[n]
            for n in nodes
            if node_fits(self.nodes[n].free, req)
            and (caps is None or caps.get(n, 0) >= need(self.nodes[n].free, req).gpus)
            and self.nodes[n].fits_during(req, self.now, end, exempt=resv)
        ]
        picked = choose(fit, req, self.topology, _free)
        if picked is None:
            return None
        out = self._take(picked, req, end)
        if caps is not None:
            for alloc in out:
                node = self.nodes[alloc.node]
                self._changed(node)
                key = (resv, alloc.node)
                self._member_gpus[key] = self._member_gpus.get(key, 0) + len(alloc.gpus)
                node.resv = [
                    msgspec.structs.replace(h, gpus=max(h.gpus - len(alloc.gpus), 0)) if h.resv == resv else h
                    for h in node.resv
                ]
        return out

    def reserve(self, partition: str, req: Request, limit: float, window: float) -> float | None:
        """Reserve the earliest start of ``req`` within ``window``; its time, or None if none is found.

        At each time a window opens (``timeline.openings``), the nodes are tried by (busy now first, name), a
        group of nodes in the same state at a time (``_groups``: the checks give each of its nodes the same
        answer). A node without holds needs no check beyond its earliest start: its free capacity only grows
        with time, so it fits over any window from that start on, and it fits now only if its earliest
        start is now.
        """
        self._settle()
        now = self.now
        groups = self._groups(partition, req)
        starts, times = openings(groups, req, limit, now + window, self._profiles)
        for t in times:
            busy: list[NodePlan] = []  # busy now: first, so that what is free now stays for backfill
            idle: list[NodePlan] = []
            for s, nodes in starts:
                if s > t:
                    break
                first = nodes[0]
                if first.held():
                    if first.fits_during(req, t, t + limit):
                        (idle if node_fits(first.free, req) else busy).extend(nodes)
                else:
                    (idle if s == now and node_fits(first.free, req) else busy).extend(nodes)
            busy.sort(key=_name)
            idle.sort(key=_name)
            picked = choose(busy + idle, req, self.topology, _free)
            if picked is not None:
                self._hold(picked, req, t, t + limit, partition)
                return t
        return None

    def _hold(self, picked: list[NodePlan], req: Request, start: float, end: float, partition: str) -> None:
        """Hold what one node of ``req`` needs on each picked node over ``[start, end)``.

        A node with no CPU free now cannot start a job in this cycle (every job asks for a CPU per node:
        ``start_now`` puts the holds on first for one that does not), so until a reservation or an advance
        reservation's start reads the nodes' future, what is held on it changes nothing this cycle: its
        hold waits in ``_deferred`` (``_settle`` puts it on). EASY's one reservation per partition mostly
        picks such busy nodes, and most of its holds are never put on at all.
        """
        busy = [n for n in picked if n.free.cpus < 1]
        if busy:
            self._deferred.append((busy, req, start, end))
            picked = [n for n in picked if n.free.cpus >= 1]
        self._hold_now(picked, req, start, end, partition)

    def _settle(self) -> None:
        """Put the deferred holds on their nodes, in the order they were made."""
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for nodes, req, start, end in deferred:
                self._hold_now(nodes, req, start, end, "")

    def _hold_now(
        self, picked: list[NodePlan], req: Request, start: float, end: float, partition: str
    ) -> None:
        """Hold what one node of ``req`` needs on each picked node over ``[start, end)``: the nodes in the
        same state (``node_state``) need the same and stay in one state, so each such group gets one
        ``Hold``, one list of holds and its new state, and ``partition``'s index its nodes as one held
        group if none of its nodes was held before."""
        by_state: dict[Signature, list[NodePlan]] = {}
        for node in picked:
            by_state.setdefault(node.sig or node_state(node), []).append(node)
        partitions: set[tuple[str, ...]] = set()
        plain: list[list[NodePlan]] = []  # the groups without holds before this one
        saved, undo = self._saved, self._undo
        for sig, nodes in by_state.items():
            assert sig is not None
            first = nodes[0]
            want = need(first.free, req)
            hold = Hold(start, end, want.cpus, want.gpus, want.mem_mb)
            # Their lists are equal (one state); lists are replaced, never changed, so one serves them all.
            holds = [*first.holds, hold]
            after = msgspec.structs.replace(sig, holds=tuple(holds))  # their ``node_state`` with the hold
            if not first.held():
                plain.append(nodes)
            for node in nodes:
                free = node.free
                if undo and free.name not in saved:  # ``_save``, inline: a reservation holds tens of nodes
                    saved[free.name] = (node, free, node.releases, node.holds, node.resv, node.sig)
                node.holds, node.sig = holds, after
                partitions.add(free.partitions)
        for names in partitions:
            self.views.forget(names, True)
        self.views.held(plain, partition)

    def _groups(self, partition: str, req: Request) -> list[list[NodePlan]]:
        """The partition's nodes in groups of the same state (``node_state``; each node alone for a request
        with ``-x``, whose eligibility depends on the name), kept until one of them changes."""
        if req.exclude:
            return [[n] for n in self.members(partition)]
        return self.views.groups_of(partition)

    def changing(self, node: NodePlan) -> None:
        """A node's capacity, releases or holds are about to change (``reservations.hold`` too): what it
        was is kept for ``restore``; its state and its partitions' groups go, and their indexes are built
        again from the nodes on first use (they are to be held before the cycle decides anything)."""
        self._settle()
        self._changed(node)
        self.views.unseed(node.free.partitions)

    def restore(self) -> None:
        """Undo every change of the cycle to the nodes' plans (they are the ones kept across cycles)."""
        self._deferred.clear()
        for node, free, releases, holds, resv, sig in self._saved.values():
            node.free, node.releases, node.holds, node.resv, node.sig = free, releases, holds, resv, sig
        self._saved.clear()

    def _changed(self, node: NodePlan) -> None:
        """``changing``."""
        self._save(node)
        self.views.forget(node.free.partitions, node.held())

    def _save(self, node: NodePlan) -> None:
        """Keep what the node is for ``restore`` (once per cycle) and forget its state. Whatever changes a
        node's plan then replaces its lists rather than change them in place, so keeping them is enough."""
        name = node.free.name
        if self._undo and name not in self._saved:
            self._saved[name] = (node, node.free, node.releases, node.holds, node.resv, node.sig)
        node.sig = None


#: Key functions, in C (reservations sort tens of nodes by them): a plan's ``Free``, a name.
_free, _name = attrgetter("free"), attrgetter("free.name")
