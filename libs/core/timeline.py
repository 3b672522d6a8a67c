"""One node's capacity over time during a planning cycle (``NodePlan``): what is free now, what running jobs
give back and when (``Release``), and what is held (``Hold``: planned starts and advance reservations).
The planner (``backfill.py``) keeps one per node, groups nodes by ``node_state`` and scans a partition's nodes
through a ``BestFit`` index."""

from __future__ import annotations

import bisect
import math
from operator import itemgetter

import msgspec

from corral.libs.core.placement import Amount, Free, Request, eligible, need
from corral.schemas.events import NodeAllocation

INF = math.inf
#: A change's time (``Profile``), in C.
_time = itemgetter(0)
#: A release time before any plan's ``now``: given back now (an orphan's, expected gone at any moment).
DUE = 0.0


class Release(msgspec.Struct, frozen=True, gc=False, order=True):
    """What a run gives back on one node, and when (its start + time limit); ordered by time first."""

    when: float  # when it is given back
    cpus: int  # CPUs
    gpus: int  # GPUs (a count)
    mem_mb: int  # memory MiB


class Hold(msgspec.Struct, frozen=True, gc=False):
    """Capacity held on one node over ``[start, end)``: a job's planned start, or an advance reservation."""

    start: float  # from
    end: float  # until (excluded)
    cpus: int  # CPUs
    gpus: int  # GPUs (a count)
    mem_mb: int  # memory MiB
    resv: str | None = None  # the advance reservation (its members do not see it); None: a planned start


class NodeState(msgspec.Struct, frozen=True, gc=False, cache_hash=True):
    """Everything the checks of a request without ``-x`` read of a node but its name and GPU indices
    (``node_state``). Its hash is kept once computed: the planner groups the nodes by it in every cycle."""

    cpus: int  # free CPUs
    gpus: int  # free GPUs (a count)
    mem_mb: int  # free memory MiB
    idle: bool  # nothing runs on it
    gpu_type: str | None  # GPU model
    features: tuple[str, ...]  # node features
    total_cpus: int  # the node's CPUs
    total_gpus: int  # the node's GPUs
    total_mem_mb: int  # the node's memory MiB
    releases: tuple[Release, ...]  # ``NodePlan.releases``
    holds: tuple[Hold, ...]  # ``NodePlan.holds``
    resv: tuple[Hold, ...]  # ``NodePlan.resv``


#: ``node_state`` of a node (None: not known).
Signature = NodeState | None


class NodePlan(msgspec.Struct, gc=False):
    """One node's capacity over time during a planning cycle (kept across cycles by ``capacity.py``; the
    planner undoes its cycle's changes, ``Planner.restore``)."""

    free: Free  # capacity free now (GPU indices included)
    releases: list[Release] = []  # sorted by time
    holds: list[Hold] = []  # the planned starts of jobs with a reservation
    resv: list[Hold] = []  # advance reservations: held from all but their members
    sig: Signature = None  # ``node_state`` of the node, until it changes (None: not known)

    def _holds(self, exempt: str | None) -> list[Hold]:
        """The holds a job sees: every backfill hold, and the advance reservations but ``exempt``."""
        if not self.resv:
            return self.holds
        return self.holds + [h for h in self.resv if h.resv != exempt]

    def free_at(self, t: float, exempt: str | None = None) -> Amount:
        """What is free at time ``t`` after releases and holds."""
        cpus, gpus, mem = self.free.cpus, len(self.free.gpus), self.free.mem_mb
        for r in self.releases:
            if r.when > t:
                break
            cpus, gpus, mem = cpus + r.cpus, gpus + r.gpus, mem + r.mem_mb
        for h in self._holds(exempt):
            if h.start <= t < h.end:
                cpus, gpus, mem = cpus - h.cpus, gpus - h.gpus, mem - h.mem_mb
        return Amount(cpus, gpus, mem)

    def fits_during(self, req: Request, a: float, b: float, exempt: str | None = None) -> bool:
        """Whether one node of ``req`` fits over ``[a, b)``: free capacity only drops where a hold starts."""
        want = need(self.free, req)
        points = [a, *(h.start for h in self._holds(exempt) if a < h.start < b)]
        for p in points:
            have = self.free_at(p, exempt)
            if have.cpus < want.cpus or have.gpus < want.gpus or have.mem_mb < want.mem_mb:
                return False
        return True

    def earliest(self, req: Request, now: float, limit: float, profile: Profile | None = None) -> float:
        """The earliest time from ``now`` this node can host one node of ``req`` for ``limit`` seconds.
        ``profile``: this node's ``Profile`` from ``now``, if the caller keeps them (built here if not)."""
        if not self.holds and not self.resv:
            # Without holds free capacity only grows: walk the releases once.
            want = need(self.free, req)
            cpus, gpus, mem = self.free.cpus, len(self.free.gpus), self.free.mem_mb
            if cpus >= want.cpus and gpus >= want.gpus and mem >= want.mem_mb:
                return now
            for r in self.releases:
                cpus, gpus, mem = cpus + r.cpus, gpus + r.gpus, mem + r.mem_mb
                if cpus >= want.cpus and gpus >= want.gpus and mem >= want.mem_mb:
                    return max(r.when, now)
            return INF
        return (profile or Profile(self, now)).earliest(need(self.free, req), limit)

    def fills_hole(self, end: float) -> bool:
        """A job ending at ``end`` uses capacity reserved after it (rather than unreserved capacity)."""
        return any(h.start >= end for h in self._holds(None))

    def key(self) -> tuple[int, int, str]:
        """The node's place in best-fit order: free GPUs, free CPUs, name."""
        return (len(self.free.gpus), self.free.cpus, self.free.name)

    def held(self) -> bool:
        """Whether something is reserved on the node (its future is more than its releases)."""
        return bool(self.holds or self.resv)

    def release(self, when: float, alloc: NodeAllocation) -> None:
        """Record that ``alloc`` gives its resources back at ``when``."""
        self.sig = None
        if when < INF:
            # A new list: the old one may be kept for the planner's ``restore``.
            releases = list(self.releases)
            bisect.insort(releases, Release(when, alloc.cpus, len(alloc.gpus), alloc.mem_mb))
            self.releases = releases


class Profile:
    """A held node's free capacity from ``now`` on, as a step function of time (what ``NodePlan.earliest``
    reads for a node with holds): the capacity from each time it changes, and whether that time is one
    a start may be planned at (``now``, a release, a hold's end: the times it grows). It depends on nothing
    but what ``node_state`` holds and ``now``, so the planner keeps one per node state and cycle
    (``Planner.reserve``: conservative backfill asks every node for each of thousands of reservations)."""

    __slots__ = ("caps", "starts", "times")

    def __init__(self, node: NodePlan, now: float) -> None:
        free = node.free
        cpus, gpus, mem = free.cpus, len(free.gpus), free.mem_mb
        # (time, CPUs, GPUs, MiB it adds, whether a start may be planned then): what changes after ``now``.
        changes: list[tuple[float, int, int, int, bool]] = []
        for r in node.releases:
            if r.when > now:
                changes.append((r.when, r.cpus, r.gpus, r.mem_mb, True))
            else:
                cpus, gpus, mem = cpus + r.cpus, gpus + r.gpus, mem + r.mem_mb
        for h in node._holds(None):
            if h.end <= now:
                continue  # over before now: it holds nothing from now on
            if h.start <= now:
                cpus, gpus, mem = cpus - h.cpus, gpus - h.gpus, mem - h.mem_mb
            else:
                changes.append((h.start, -h.cpus, -h.gpus, -h.mem_mb, False))
            if h.end < INF:
                changes.append((h.end, h.cpus, h.gpus, h.mem_mb, True))
        changes.sort(key=_time)
        self.times: list[float] = [now]  # each distinct time the capacity changes, ascending
        self.caps: list[tuple[int, int, int]] = [(cpus, gpus, mem)]  # (CPUs, GPUs, MiB) free from then on
        self.starts: list[bool] = [True]  # whether a start may be planned then
        times, caps, starts = self.times, self.caps, self.starts
        for when, c, g, m, start in changes:
            cpus, gpus, mem = cpus + c, gpus + g, mem + m
            if when == times[-1]:
                caps[-1] = (cpus, gpus, mem)
                starts[-1] = starts[-1] or start
            else:
                times.append(when)
                caps.append((cpus, gpus, mem))
                starts.append(start)

    def reopens(self, want: Amount, limit: float, after: float, horizon: float) -> list[float]:
        """The times after ``after`` (the earliest start), up to ``horizon``, at which the windows ``want``
        fits for ``limit`` seconds open again after a hold closed them: ``want`` fits from the time on, and
        did not fit just before it (the capacity was short then). Every time a window opens is the earliest
        or one of these (``Planner.reserve`` tries them all)."""
        times, caps, starts = self.times, self.caps, self.starts
        wc, wg, wm = want.cpus, want.gpus, want.mem_mb
        out: list[float] = []
        for i in range(bisect.bisect_right(times, after), len(times)):
            t = times[i]
            if t > horizon:
                break
            c, g, m = caps[i - 1]  # just before ``t``
            if not starts[i] or (c >= wc and g >= wg and m >= wm):
                continue
            end, j = t + limit, i
            while j < len(times) and (j == i or times[j] < end):
                c, g, m = caps[j]
                if c < wc or g < wg or m < wm:
                    break
                j += 1
            else:
                out.append(t)
        return out

    def earliest(self, want: Amount, limit: float) -> float:
        """The first time a start may be planned at from which ``want`` fits for ``limit`` seconds, as
        ``NodePlan.fits_during`` says (INF: none).

        The least of the capacity over ``[t, t + limit)`` is at ``t`` or at a time in the window (where a
        hold starts, as ``fits_during`` checks; elsewhere it only grows), so checking every time in the
        window answers as ``fits_during``. A time that fails a window fails every candidate before it too
        (their windows hold it): the next candidate tried is after it."""
        times, caps, starts = self.times, self.caps, self.starts
        wc, wg, wm = want.cpus, want.gpus, want.mem_mb
        n, i = len(times), 0
        while i < n:
            if not starts[i]:
                i += 1
                continue
            t = times[i]
            end = t + limit
            j = i
            while j < n and (j == i or times[j] < end):
                c, g, m = caps[j]
                if c < wc or g < wg or m < wm:
                    break
                j += 1
            else:
                return t
            i = j + 1  # every candidate up to the time that failed fails on it too
        return INF


class Profiles:
    """The ``Profile`` of each held node state from ``now``, built on first use, for one cycle: a state is a
    value, so a node that changes has another one, and a profile is right for every node in its state."""

    def __init__(self, now: float) -> None:
        self.now = now
        self._by_state: dict[NodeState, Profile] = {}

    def of(self, node: NodePlan) -> Profile | None:
        """The node's profile if it is held (None if not: ``NodePlan.earliest`` needs none then)."""
        if not node.held():
            return None
        sig = node_state(node)
        profile = self._by_state.get(sig)
        if profile is None:
            profile = self._by_state[sig] = Profile(node, self.now)
        return profile


def openings(
    groups: list[list[NodePlan]], req: Request, limit: float, horizon: float, profiles: Profiles
) -> tuple[list[tuple[float, list[NodePlan]]], list[float]]:
    """Where one node each of ``req`` could start on groups of nodes (each in one state) for ``limit``
    seconds, from the profiles' ``now`` up to ``horizon`` (``Planner.reserve``): each eligible group's
    earliest start with the group, in order; and the times a start may be planned at, in order. Those are
    the times a window opens, from the first by which ``req.nodes`` nodes could start: every earliest start,
    and every time a held group's window, closed by a hold after its earliest start, opens again
    (``Profile.reopens``). With the earliest starts alone, a node held for a while after its earliest start
    was missed at every later time, and a job that needed it once the others were free got no start at
    all."""
    now = profiles.now
    starts: list[tuple[float, list[NodePlan]]] = []
    reopen: list[float] = []
    for nodes in groups:
        first = nodes[0]
        if eligible(first.free, req):
            profile = profiles.of(first)
            t = first.earliest(req, now, limit, profile)
            if t <= horizon:
                starts.append((t, nodes))
                if profile is not None:
                    reopen += profile.reopens(need(first.free, req), limit, t, horizon)
    starts.sort(key=_time)
    count = 0
    for t, nodes in starts:
        count += len(nodes)
        if count >= req.nodes:
            times = {s for s, _ in starts if s >= t}
            times.update(s for s in reopen if s > t)
            return starts, sorted(times)
    return starts, []


class BestFit:
    """The nodes of one partition as ``Planner.start_now`` scans them: those without holds in best-fit order
    (free GPUs, free CPUs, name: the ones that can fit a request follow its GPU and CPU counts), the few
    with holds apart (they need the full check)."""

    def __init__(self, nodes: list[NodePlan]) -> None:
        self.keys: list[tuple[int, int, str]] = []  # the nodes without holds, sorted
        self.held: dict[str, NodePlan] = {}  # the nodes with holds, by name
        for n in nodes:
            if n.held():
                self.held[n.free.name] = n
            else:
                self.keys.append(n.key())
        self.keys.sort()
        self.groups: list[list[NodePlan]] | None = None  # ``held`` by ``node_state``, built on first use

    @classmethod
    def of_keys(cls, keys: list[tuple[int, int, str]]) -> BestFit:
        """The index of nodes none of which is held, from their keys in best-fit order."""
        index = cls([])
        index.keys = keys
        return index

    def held_groups(self) -> list[list[NodePlan]]:
        """The held nodes in groups of the same capacity, releases and holds: the checks of a request
        without ``-x`` give every node of a group the same answer (only their names differ)."""
        if self.groups is None:
            groups: dict[NodeState, list[NodePlan]] = {}
            for node in self.held.values():
                groups.setdefault(node.sig or node_state(node), []).append(node)
            self.groups = list(groups.values())
        return self.groups

    def remove(self, key: tuple[int, int, str]) -> None:
        """Take a key out of the best-fit order."""
        del self.keys[bisect.bisect_left(self.keys, key)]


def span(seconds: float, resolution: int) -> float:
    """A duration as the plan counts it: rounded up to a multiple of the resolution (a reservation's time
    limit; ``resolution`` 0 keeps it exact)."""
    if resolution <= 0 or seconds == INF:
        return seconds
    return math.ceil(seconds / resolution) * resolution


def release_at(end: float, resolution: int) -> float:
    """When the plan has a run ending at ``end`` (INF: unlimited) give its resources back: the first multiple
    of the resolution at or after ``end`` (``resolution`` 0: ``end`` itself). A release at or before the
    plan's ``now`` counts as given back now (``NodePlan``'s checks never look before ``now``): an overdue run
    (past its limit, not yet seen to end) is expected to end at any moment.

    The grid is fixed in time, as Slurm's bf_resolution map is, not counted from ``now``, and an overdue run's
    release is not moved to ``now``: a run's planned release is the same in every cycle, so the nodes' plans
    kept across cycles (``capacity.py``) stay as they are when only the clock moved, and so do the planned
    starts squeue shows. The ends of every running job fall on a few grid points (fewer distinct times to
    check)."""
    if resolution <= 0 or end == INF:
        return end
    return float(math.ceil(end / resolution) * resolution)


def node_state(node: NodePlan) -> NodeState:
    """Everything the checks of a request without ``-x`` read of a node, but its name and GPU indices
    (kept in ``node.sig`` until the node changes)."""
    if node.sig is not None:
        return node.sig
    f = node.free
    sig = node.sig = NodeState(
        f.cpus,
        len(f.gpus),
        f.mem_mb,
        f.idle,
        f.gpu_type,
        f.features,
        f.total_cpus,
        f.total_gpus,
        f.total_mem_mb,
        tuple(node.releases),
        tuple(node.holds),
        tuple(node.resv),
    )
    return sig
