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

It keeps each node's ``NodePlan`` (its ``Free`` and the releases of the runs on it) the same way: every
run's release time and allocations (``run_release``, on a grid fixed in time, so ``now`` moving changes
none) are compared with those kept, and only the nodes whose ``Free`` is another object or whose runs'
releases changed get a new plan. The planner undoes its cycle's changes to the plans it
is given (``Planner.restore``), so what is kept is always the state's.

Both comparisons pass over every node and every run in every cycle. A cache that follows the state
(``capacity``, ``changes.py``) reads instead what the fold noted since the last cycle, the jobs and nodes its
entries touched, and looks again only at those; it compares everything, as above, in its first cycle and
whenever it cannot know (another state, another resolution, a journal that started again, a node that came).
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Sequence
from itertools import compress
from operator import is_not, ne

import msgspec

from corral.libs.core import changes
from corral.libs.core.changes import Changes
from corral.libs.core.job_facts import FactsCache
from corral.libs.core.partitions import Kept
from corral.libs.core.placement import Free, free_capacity, free_of, give_back
from corral.libs.core.preempt import expected_end
from corral.libs.core.state import Job, Node, State
from corral.libs.core.timeline import DUE, INF, NodePlan, Release, release_at
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
    nodes' ``NodePlan`` and the releases of their runs; each pending job's ``Facts``. ``follow``: read what
    the fold changed (``changes.py``) rather than compare everything (a cache used once need not)."""

    def __init__(self, follow: bool = True) -> None:
        self._names: list[str] = []  # the state's nodes by name, in the state's order, as last seen
        self._index: dict[str, int] = {}  # each name's position in ``_names``
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
        # Following the fold's notes: the journal read, up to where, for which resolution; the running jobs
        # whose run exited (not concluded yet: their nodes that reported it gone are free now); the orphans.
        self._follow = follow
        self._journal: Changes | None = None
        self._mark = 0
        self._resolution = 0
        self._exited: set[int] = set()
        self._orphans: set[Hashable] = set()
        self.compared = 0  # cycles that compared every node and run (``capacity``), for the tests

    def capacity(
        self, state: State, running: list[Job], resolution: int
    ) -> tuple[dict[str, Free], dict[str, NodePlan]]:
        """Every node's capacity now (the runs whose exit the cycle concludes give theirs back on the nodes
        that reported it) and its plan: when each run (``running``: every running job) gives its resources
        back (``run_release``) and each orphan (now: ``DUE``). What the cycle changes in a ``Free`` it
        replaces with a copy first."""
        journal = changes.of(state) if self._follow else None
        keys = None
        if journal is not None and journal is self._journal and resolution == self._resolution:
            keys = journal.since(self._mark)
        dirty: set[str] = set()  # nodes whose runs' releases changed
        orphans: Runs = {}  # each orphan's resources are given back now, in every cycle
        for orphan in state.orphans:
            alloc = NodeAllocation(node=orphan.node, gpus=orphan.gpus, cpus=orphan.cpus, mem_mb=orphan.mem_mb)
            orphans[(orphan.job_id, orphan.attempt, orphan.node)] = (DUE, [alloc])
        touched = None if keys is None else {k for k in keys if isinstance(k, str)}
        free = None if touched is None else self._free_touched(state.nodes, touched)
        if keys is None or free is None:
            self.compared += 1
            free = self.free_capacity(state.nodes)
            runs: Runs = {}
            for job in running:
                release = run_release(job, resolution)
                if release is not None:
                    runs[job.job_id] = release
            self._exited = {job.job_id for job in running if job.run_exit is not None}
            runs.update(orphans)
            self._set_runs(runs, dirty)
            if self._follow:
                self._journal, self._resolution = changes.follow(state), resolution
        else:
            for key, release in orphans.items():
                self._update_run(key, release, dirty)
            for key in self._orphans.difference(orphans):
                self._update_run(key, None, dirty)
            for job_id in {k for k in keys if isinstance(k, int)}:
                now = state.jobs.get(job_id)
                if now is not None and now.state == "RUNNING":
                    self._update_run(job_id, run_release(now, resolution), dirty)
                    if now.run_exit is not None:
                        self._exited.add(job_id)
                        continue
                else:
                    self._update_run(job_id, None, dirty)
                self._exited.discard(job_id)
        if self._journal is not None:
            self._mark = self._journal.end
        # A run whose exit is concluded in this cycle frees its resources now: the conclusion is appended
        # before any allocation that uses them (and the fold refuses the allocation if not). Only on the
        # nodes whose agents reported the run's processes gone: the others stay held (fold).
        for job_id in self._exited:
            job = state.jobs[job_id]
            for alloc in job.allocations:
                node = free.get(alloc.node)
                if node is not None and alloc.node in job.exited_nodes:
                    free[alloc.node] = node = copy.copy(node)  # it is the cache's
                    give_back(node, alloc)
        self._orphans = set(orphans)
        return free, self._replan(free, dirty)

    def free_capacity(self, nodes: dict[str, Node]) -> dict[str, Free]:
        """``placement.free_capacity(nodes)``, reusing what is unchanged (by name; copy one to change it)."""
        names, values = list(nodes), list(nodes.values())
        if names != self._names:
            # Nodes came or went (or another state's): build them all again, in name order.
            self._names, self._kept = names, [_kept(n) for n in values]
            self._index = {name: i for i, name in enumerate(names)}
            built = free_capacity(nodes)
            self._free = built
            return dict(built)
        kept, order = self._kept, False
        # Every node compared with its copy (struct ``==``, by value), in C; the few that differ built again.
        for i in compress(range(len(values)), map(ne, values, kept)):
            order = self._build(i, names[i], values[i]) or order
        if order:  # a node went down or came back up: keep the name order
            self._free = {name: self._free[name] for name in sorted(self._free)}
        return dict(self._free)

    def _free_touched(self, nodes: dict[str, Node], touched: set[str]) -> dict[str, Free] | None:
        """``free_capacity`` when only the nodes ``touched`` may have changed; None if a node came or went."""
        if len(nodes) != len(self._names):
            return None
        index, order = self._index, False
        for name in touched:
            i, node = index.get(name), nodes.get(name)
            if i is None or node is None:
                return None
            if node != self._kept[i]:
                order = self._build(i, name, node) or order
        if order:
            self._free = {name: self._free[name] for name in sorted(self._free)}
        return dict(self._free)

    def _build(self, i: int, name: str, node: Node) -> bool:
        """Build node ``name`` (at ``i``) again; True if it went down or came up (the name order to keep)."""
        self._kept[i] = _kept(node)
        out, free = self._free, free_of(name, node)
        if free is None:
            return out.pop(name, None) is not None
        gone = name not in out
        out[name] = free
        return gone

    def _set_runs(self, runs: Runs, dirty: set[str]) -> None:
        """Every run as it is now (``runs``): those not given forgotten."""
        for key, release in runs.items():
            self._update_run(key, release, dirty)
        kept = self._runs
        if len(kept) > len(runs):
            for key in [k for k in kept if k not in runs]:
                self._update_run(key, None, dirty)

    def _update_run(
        self, key: Hashable, release: tuple[float, Sequence[NodeAllocation]] | None, dirty: set[str]
    ) -> None:
        """Run ``key`` as it is now: its release time and allocations, or None if it holds nothing now. The
        nodes whose releases change go to ``dirty``."""
        kept = self._runs
        was = kept.get(key)
        if release is None:
            if was is not None:
                self._release(key, kept.pop(key)[1], dirty)
            return
        when, allocations = release
        if was is not None:
            if was[0] == when and was[1] == allocations:
                return
            self._release(key, was[1], dirty)
        kept[key] = (when, list(allocations))
        if when < INF:
            for alloc in allocations:
                self._releases.setdefault(alloc.node, {})[key] = Release(
                    when, alloc.cpus, len(alloc.gpus), alloc.mem_mb
                )
                dirty.add(alloc.node)

    def _replan(self, free: dict[str, Free], dirty: set[str]) -> dict[str, NodePlan]:
        """Each node of ``free`` with its runs' releases, reusing the plans whose ``Free`` is the same object
        and whose releases are unchanged (not in ``dirty``)."""
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
        """Each partition's views of the plans ``capacity`` last gave (built again after a node came,
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


def run_release(job: Job, resolution: int) -> tuple[float, Sequence[NodeAllocation]] | None:
    """When a running job's run gives its resources back, on the grid of ``resolution``
    (``timeline.release_at``; sooner if it is being preempted), and what it holds; None if its exit is
    known (its resources come back as its nodes report it gone) or it has no start."""
    if job.run_exit is not None or job.start_time is None:
        return None
    limit = job.time_limit_s
    end = INF if limit is None else job.start_time + limit
    return release_at(expected_end(job, end), resolution), job.allocations
