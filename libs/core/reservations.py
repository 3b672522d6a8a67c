"""Advance reservations (``scontrol create reservation``): their fold, the scheduler's answer, and their time
logic in the backfill planner. Pure and deterministic, like the rest of the core.

Lifecycle (decisions are events): the gateway appends ``ReservationCreateRequested`` or
``ReservationDeleteRequested`` on ``corral.evt.resv.<name>.<tag>``; the fold keeps the newest unanswered
request per name; ``plan()`` answers it (``answer_requests``) with ``ReservationCreated`` (the concrete
nodes, chosen here), ``ReservationRejected`` (Slurm's reason) or ``ReservationDeleted``. A reservation is
over once the log's clock (``State.now``) or the planner's ``now`` reaches its end: the fold drops it at
the first entry after its end, the planner and the views ignore it from its end on.

Choosing the nodes (create):

- ``Nodes=``: exactly those (every one registered; drained ones too, as an admin reserves a node to repair);
- ``NodeCnt=N`` and ``TRES=gres/gpu=N`` never choose a down or drained node;
- ``NodeCnt=N``: ``N`` nodes of the partition that are free over the window, idle ones first, then by name;
- ``TRES=gres/gpu=N``: ``N`` GPUs of the partition, taken greedily from nodes idle now first, then from the
  nodes with the most GPUs free over the window, then by name; the other GPUs of those nodes stay usable.

A node is free over the window when no other reservation overlapping it holds it (``MAINT`` may overlap)
and, unless ``IGNORE_JOBS`` or ``MAINT``, no running job on it may still run at the start (its start +
time limit; an unlimited job runs forever). Otherwise the request is rejected: ``Requested nodes are busy``.

In the planner, a reservation is a hold for outsiders on each of its nodes over ``[start, end)``: the whole
node, or its GPUs not used by its own members. A job that asks for it (``--reservation``) and may use it
(its user is in ``Users`` or its account in ``Accounts``) runs only on its nodes, only within its window
(start no earlier, time limit ending no later than the end), and sees no hold of its own reservation; it
blocks no other job and gets no backfill reservation. Reasons of a pending member: ``Reservation`` (window
not begun, limit beyond the end, or not allowed), ``ReservationDeleted`` (no such reservation now),
``Resources`` (its reservation is full now).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.libs.core.backfill import Planner
from corral.libs.core.outcome import APPLIED, Outcome, ignored
from corral.libs.core.placement import Request
from corral.libs.core.reasons import PendingReason
from corral.libs.core.state import Job, Node, State, drained
from corral.libs.core.timeline import INF, Hold
from corral.schemas import events as ev

#: Slurm's answers to a reservation request that cannot be carried out.
BUSY = "Requested nodes are busy"
DUPLICATE = "Duplicate reservation name"
INVALID_NODES = "Invalid node name specified"
INVALID_PARTITION = "Invalid partition name specified"
INVALID_TIME = "Invalid time specification"
INVALID_RESV = "Requested reservation is invalid"


# --- fold -----------------------------------------------------------------------------------------------


def expire_reservations(state: State) -> None:
    """Forget the reservations whose end the log's clock has reached."""
    over = [name for name, resv in state.reservations.items() if resv.end_time <= state.now]
    for name in over:
        del state.reservations[name]


def _requested(
    state: State, seq: int, at: float, body: ev.ReservationCreateRequested | ev.ReservationDeleteRequested
) -> Outcome:
    state.resv_seqs[body.name] = seq
    state.resv_requests[body.name] = body
    return APPLIED


def _created(state: State, seq: int, at: float, body: ev.ReservationCreated) -> Outcome:
    state.resv_seqs[body.name] = seq
    # A name is never held twice: a second creation under a live name changes nothing.
    if body.name in state.reservations:
        return ignored("duplicate")
    if body.end_time <= state.now:
        return ignored("expired")
    state.reservations[body.name] = body
    state.resv_requests.pop(body.name, None)
    return APPLIED


def _rejected(state: State, seq: int, at: float, body: ev.ReservationRejected) -> Outcome:
    state.resv_seqs[body.name] = seq
    state.resv_requests.pop(body.name, None)
    return APPLIED


def _deleted(state: State, seq: int, at: float, body: ev.ReservationDeleted) -> Outcome:
    state.resv_seqs[body.name] = seq
    state.reservations.pop(body.name, None)
    state.resv_requests.pop(body.name, None)
    return APPLIED


#: Fold handlers of the reservation events (merged into ``fold.HANDLERS``).
RESERVATION_HANDLERS: dict[type, Callable[[State, int, float, Any], Outcome]] = {
    ev.ReservationCreateRequested: _requested,
    ev.ReservationDeleteRequested: _requested,
    ev.ReservationCreated: _created,
    ev.ReservationRejected: _rejected,
    ev.ReservationDeleted: _deleted,
}


# --- queries ----------------------------------------------------------------------------------------------


def live(state: State, now: float) -> list[ev.ReservationCreated]:
    """The reservations not over at ``now``, by name."""
    return [state.reservations[n] for n in sorted(state.reservations) if state.reservations[n].end_time > now]


def may_use(resv: ev.ReservationCreated, user: str, account: str) -> bool:
    """Whether a job of ``user`` under ``account`` may run in the reservation (Users= or Accounts=)."""
    return user in resv.users or account in resv.accounts


def _overlaps(a: ev.ReservationCreated, start: float, end: float) -> bool:
    return a.start_time < end and start < a.end_time


def _job_end(job: Job) -> float:
    if job.start_time is None or job.time_limit_s is None:
        return INF
    return job.start_time + job.time_limit_s


def _gpus_held(state: State, node: str, start: float, end: float) -> int | None:
    """GPUs other reservations hold on ``node`` over ``[start, end)``; None if one holds the whole node."""
    held = 0
    for other in state.reservations.values():
        if node not in other.nodes or not _overlaps(other, start, end):
            continue
        if not other.gpus:
            return None
        held += other.gpus[other.nodes.index(node)]
    return held


def _busy_gpus(state: State, node: Node, start: float) -> int:
    """GPUs of the jobs running on ``node`` that may still run at ``start``."""
    busy = 0
    for job_id in node.jobs:
        job = state.jobs[job_id]
        if _job_end(job) > start:
            busy += sum(len(a.gpus) for a in job.allocations if a.node == node.name)
    return busy


def _jobs_at(state: State, node: Node, start: float) -> bool:
    """Whether a job running on ``node`` may still run at ``start``."""
    return any(_job_end(state.jobs[job_id]) > start for job_id in node.jobs)


# --- the scheduler's answer --------------------------------------------------------------------------------


def answer_requests(state: State, now: float, default_partition: str) -> list[ev.Event]:
    """One decision per unanswered reservation request, by name."""
    out: list[ev.Event] = []
    for name in sorted(state.resv_requests):
        request = state.resv_requests[name]
        if isinstance(request, ev.ReservationDeleteRequested):
            if name in state.reservations and state.reservations[name].end_time > now:
                out.append(ev.ReservationDeleted(name=name, by=request.user))
            else:
                out.append(ev.ReservationRejected(name=name, reason=INVALID_RESV, delete=True))
            continue
        out.append(create(state, now, request, default_partition))
    return out


def create(
    state: State, now: float, req: ev.ReservationCreateRequested, default_partition: str
) -> ev.ReservationCreated | ev.ReservationRejected:
    """The answer to a create request: the reservation with its nodes chosen, or why not."""
    existing = state.reservations.get(req.name)
    if existing is not None and existing.end_time > now:
        return ev.ReservationRejected(name=req.name, reason=DUPLICATE)
    if req.end_time <= req.start_time or req.end_time <= now:
        return ev.ReservationRejected(name=req.name, reason=INVALID_TIME)
    partition = req.partition or default_partition
    members = [state.nodes[n] for n in sorted(state.nodes) if partition in state.nodes[n].partitions]
    if not req.nodes and not members:
        return ev.ReservationRejected(name=req.name, reason=INVALID_PARTITION)
    maint = "MAINT" in req.flags
    ignore_jobs = maint or "IGNORE_JOBS" in req.flags
    start = max(req.start_time, now)
    nodes: list[str] = []
    gpus: list[int] = []
    if req.nodes:
        if any(n not in state.nodes for n in req.nodes):
            return ev.ReservationRejected(name=req.name, reason=INVALID_NODES)
        for name in sorted(set(req.nodes)):
            if not maint and _gpus_held(state, name, req.start_time, req.end_time) != 0:
                return ev.ReservationRejected(name=req.name, reason=BUSY)
            if not ignore_jobs and _jobs_at(state, state.nodes[name], start):
                return ev.ReservationRejected(name=req.name, reason=BUSY)
            nodes.append(name)
    elif req.node_count:
        free = [
            n
            for n in members
            if n.up
            and not drained(n)
            and (maint or _gpus_held(state, n.name, req.start_time, req.end_time) == 0)
            and (ignore_jobs or not _jobs_at(state, n, start))
        ]
        free.sort(key=lambda n: (bool(n.jobs), n.name))
        if len(free) < req.node_count:
            return ev.ReservationRejected(name=req.name, reason=BUSY)
        nodes = sorted(n.name for n in free[: req.node_count])
    else:
        taken = _choose_gpus(state, members, req, start, maint, ignore_jobs)
        if taken is None:
            return ev.ReservationRejected(name=req.name, reason=BUSY)
        nodes = sorted(taken)
        gpus = [taken[n] for n in nodes]
    return ev.ReservationCreated(
        name=req.name,
        start_time=req.start_time,
        end_time=req.end_time,
        nodes=nodes,
        gpus=gpus,
        partition=partition,
        users=list(req.users),
        accounts=list(req.accounts),
        flags=list(req.flags),
        by=req.user,
    )


def _choose_gpus(
    state: State,
    members: list[Node],
    req: ev.ReservationCreateRequested,
    start: float,
    maint: bool,
    ignore_jobs: bool,
) -> dict[str, int] | None:
    """``req.gpu_count`` GPUs over the partition's nodes: the GPUs taken on each node; None if too few."""
    available: list[tuple[bool, int, str]] = []
    for node in members:
        if not node.up or drained(node) or not node.gpus:
            continue
        held = 0 if maint else _gpus_held(state, node.name, req.start_time, req.end_time)
        if held is None:
            continue
        busy = 0 if ignore_jobs else _busy_gpus(state, node, start)
        free = node.gpus - held - busy
        if free > 0:
            available.append((bool(node.jobs), -free, node.name))
    available.sort()
    left = req.gpu_count
    taken: dict[str, int] = {}
    for _, minus_free, name in available:
        if left <= 0:
            break
        take = min(-minus_free, left)
        taken[name] = take
        left -= take
    return taken if left <= 0 else None


# --- the planner --------------------------------------------------------------------------------------------


def member_gpus(state: State, resv: ev.ReservationCreated) -> dict[str, int]:
    """GPUs the running jobs of the reservation use on each of its nodes."""
    used: dict[str, int] = {}
    for name in resv.nodes:
        node = state.nodes.get(name)
        if node is None:
            continue
        for job_id in node.jobs:
            job = state.jobs[job_id]
            if job.spec.reservation == resv.name:
                used[name] = used.get(name, 0) + sum(len(a.gpus) for a in job.allocations if a.node == name)
    return used


def hold(planner: Planner, state: State, reservations: list[ev.ReservationCreated]) -> None:
    """Put each live reservation in the planner: a hold of its nodes (or GPUs) for outsiders."""
    for resv in reservations:
        used = member_gpus(state, resv) if resv.gpus else {}
        for index, name in enumerate(resv.nodes):
            node = planner.nodes.get(name)
            if node is None:
                continue
            start, end, free = resv.start_time, resv.end_time, node.free
            planner.changing(node)  # its holds change
            if resv.gpus:
                gpus = max(resv.gpus[index] - used.get(name, 0), 0)
                held = Hold(start, end, 0, gpus, 0, resv=resv.name)
            else:
                held = Hold(start, end, free.total_cpus, free.total_gpus, free.total_mem_mb, resv.name)
            node.resv = [*node.resv, held]  # a new list: the old one may be kept (``Planner.restore``)


def maint_nodes(reservations: list[ev.ReservationCreated], now: float) -> set[str]:
    """Nodes a MAINT reservation holds now."""
    return {
        n for r in reservations if "MAINT" in r.flags and r.start_time <= now < r.end_time for n in r.nodes
    }


def start_member(
    planner: Planner,
    state: State,
    job: Job,
    partition: str,
    req: Request,
    limit: float,
    now: float,
    exact: float,
) -> list[ev.NodeAllocation] | PendingReason:
    """Start a job that asks for a reservation, inside it: its allocation, or the reason it waits. ``limit``:
    its time limit as the plan counts it (it must end before the reservation does); ``exact``: as it is
    (``Planner.start_in``'s)."""
    name = job.spec.reservation
    resv = state.reservations.get(name or "")
    if resv is None or resv.end_time <= now:
        return "ReservationDeleted"
    account = job.spec.account or job.user
    if not may_use(resv, job.user, account) or now < resv.start_time or now + limit > resv.end_time:
        return "Reservation"
    nodes = [n for n in resv.nodes if n in planner.nodes and partition in planner.nodes[n].free.partitions]
    caps: dict[str, int] | None = None
    if resv.gpus:
        used = member_gpus(state, resv)
        caps = {
            n: g - used.get(n, 0) - planner.started_in(resv.name, n)
            for n, g in zip(resv.nodes, resv.gpus, strict=True)
        }
    allocation = planner.start_in(resv.name, nodes, req, exact, caps)
    return allocation if allocation is not None else "Resources"
