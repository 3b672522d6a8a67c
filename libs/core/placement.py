"""Placement: which nodes, CPUs, memory and exact GPU indices a job gets, on a working copy of usage.

Pure and deterministic. ``Free`` is the capacity a node still has free in this cycle; the planner
(``backfill.py``, which also weighs reservations) places a job on whole nodes of its partition that are
up and have enough free GPUs (of the requested type), CPUs and memory, preferring the nodes with the
fewest free GPUs that still fit (best fit, to keep whole nodes free for large jobs), ties broken by
name. GPU indices are the lowest free ones, so no index is ever given to two runs.

Node choice (``-w``, ``-x``, ``-C``): a node is eligible only if it is not excluded and has the
required features; every node of ``-w`` is part of the selection, the rest chosen freely. An
``--exclusive`` job needs an idle node and takes all of it, so nothing else fits there while it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import msgspec

from corral.libs.core.state import Job, Node, State, drained
from corral.libs.slurm.cpus import cpus_per_node
from corral.schemas.events import JobSpec, NodeAllocation

T = TypeVar("T")


class Free(msgspec.Struct, gc=False):
    """Free capacity of one node during a planning cycle (a struct: one is made per node and cycle)."""

    name: str  # node name
    gpus: list[int]  # free GPU indices, ascending
    cpus: int  # free CPUs
    mem_mb: int  # free memory MiB
    total_mem_mb: int  # the node's memory (for --mem=0, "all of it")
    gpu_type: str | None  # GPU model
    partitions: tuple[str, ...]  # partitions
    idle: bool = True  # nothing runs on it (for --mem=0 and --exclusive, which take a whole node)
    features: tuple[str, ...] = ()  # node features (for --constraint)
    total_cpus: int = 0  # the node's CPUs (for --exclusive); 0: as free now
    total_gpus: int = 0  # the node's GPUs (for --exclusive); 0: as free now

    def __post_init__(self) -> None:
        # A node built idle (validation, tests) has all of its capacity free.
        self.total_cpus = self.total_cpus or self.cpus
        self.total_gpus = self.total_gpus or len(self.gpus)


def free_capacity(nodes: dict[str, Node]) -> dict[str, Free]:
    """Free capacity of every node that is up and not drained (by an admin or by its registration)."""
    out: dict[str, Free] = {}
    for name in sorted(nodes):
        free = free_of(name, nodes[name])
        if free is not None:
            out[name] = free
    return out


def free_of(name: str, node: Node) -> Free | None:
    """Free capacity of node ``name``; None if it is down or drained (``free_capacity``)."""
    if not node.up or node.drain or node.admin_drain is not None:  # ``state.drained``, inlined
        return None
    used = node.used_gpus
    if used:
        held = set(used)
        gpus = [g for g in range(node.gpus) if g not in held]
    else:
        gpus = list(range(node.gpus))
    return Free(
        name,
        gpus,
        node.cpus - node.alloc_cpus,
        node.mem_mb - node.alloc_mem_mb,
        node.mem_mb,
        node.gpu_type,
        tuple(node.partitions),
        not node.jobs and not used and node.alloc_cpus == 0 and node.alloc_mem_mb == 0,
        tuple(node.features),
        node.cpus,
        node.gpus,
    )


def unavailable_nodes(state: State, job: Job) -> list[str]:
    """The nodes the job names with ``-w`` that are down, drained or not registered (in its order)."""
    out = []
    for name in job.spec.nodelist:
        node = state.nodes.get(name)
        if node is None or not node.up or drained(node):
            out.append(name)
    return out


class Amount(msgspec.Struct, frozen=True, gc=False):
    """CPUs, GPUs and memory on one node: what a request takes there, or what is free there."""

    cpus: int  # CPUs
    gpus: int  # GPUs (a count)
    mem_mb: int  # memory MiB


class Request(msgspec.Struct, frozen=True, cache_hash=True):
    """What one node of a job needs (a struct, not a dataclass: one is built per pending job and cycle). Its
    hash is kept once computed: the cycle looks requests up by value (``Cycle.refused``)."""

    nodes: int  # number of nodes
    gpus: int  # GPUs per node
    gpu_type: str | None  # required GPU model (None: any)
    cpus: int  # CPUs per node
    mem_mb: int | None  # memory per node (None: not reserved, 0: the whole node)
    nodelist: tuple[str, ...] = ()  # -w: nodes the selection must include
    exclude: frozenset[str] = frozenset()  # -x: nodes it must not use
    features: tuple[str, ...] = ()  # -C: features a node must have (all of them, or any)
    any_feature: bool = False  # -C a|b: one of ``features`` is enough
    exclusive: bool = False  # --exclusive: idle nodes only, taken whole
    switches: int | None = None  # --switches: at most this many topology blocks (None: any number)
    segment: int = 1  # --segment: nodes go in groups of this many, each group inside one block


def request_of(job: Job) -> Request:
    """Per-node needs of a job from its spec."""
    return request_of_spec(job.spec)


def request_of_spec(spec: JobSpec) -> Request:
    """Per-node needs of a spec (also what submit validation checks against idle nodes)."""
    nodes = max(spec.nodes, len(spec.nodelist), 1)
    cpus = cpus_per_node(
        nodes, spec.ntasks, spec.ntasks_per_node, spec.cpus_per_task, spec.gpus_per_node, spec.cpus_per_gpu
    )
    return Request(
        nodes=nodes,
        gpus=spec.gpus_per_node,
        gpu_type=spec.gpu_type,
        cpus=cpus,
        mem_mb=spec.mem_per_node_mb,
        nodelist=tuple(spec.nodelist),
        exclude=frozenset(spec.exclude),
        features=tuple(spec.constraint.features) if spec.constraint else (),
        any_feature=spec.constraint.any_of if spec.constraint else False,
        exclusive=spec.exclusive,
        switches=spec.switches,
        segment=spec.segment or 1,
    )


def has_features(features: Sequence[str], required: Sequence[str], any_of: bool = False) -> bool:
    """Whether a node with ``features`` satisfies ``--constraint``: all of ``required``, or one with ``|``."""
    if not required:
        return True
    have = (f in features for f in required)
    return any(have) if any_of else all(have)


def eligible(free: Free, req: Request) -> bool:
    """Whether the node is of the kind the request can use at all (GPU type, -x, -C)."""
    return (
        (req.gpu_type is None or req.gpus == 0 or free.gpu_type == req.gpu_type)
        and free.name not in req.exclude
        and has_features(free.features, req.features, req.any_feature)
    )


def mem_need(free: Free, req: Request) -> int:
    """Memory the request takes on this node (``--mem=0`` and ``--exclusive`` take all of it)."""
    return free.total_mem_mb if req.mem_mb == 0 or req.exclusive else (req.mem_mb or 0)


def need(free: Free, req: Request) -> Amount:
    """What one node of the request takes on this node: all of it for ``--exclusive``."""
    if req.exclusive:
        return Amount(free.total_cpus, free.total_gpus, free.total_mem_mb)
    return Amount(req.cpus, req.gpus, mem_need(free, req))


def node_fits(free: Free, req: Request) -> bool:
    """Whether one node of the request fits the node's free capacity now."""
    if not eligible(free, req) or ((req.mem_mb == 0 or req.exclusive) and not free.idle):
        return False
    want = need(free, req)
    return (
        len(free.gpus) >= max(want.gpus, req.gpus)
        and free.cpus >= max(want.cpus, req.cpus)
        and free.mem_mb >= want.mem_mb
    )


def pick(fit: Sequence[T], req: Request, name: Callable[[T], str]) -> list[T] | None:
    """The ``req.nodes`` nodes to use of ``fit`` (in order of preference): every ``-w`` node, then the first
    others; None if a listed node is missing or there are too few."""
    forced = [n for n in fit if name(n) in req.nodelist]
    if len(forced) < len(set(req.nodelist)):
        return None
    chosen = forced + [n for n in fit if name(n) not in req.nodelist][: max(req.nodes - len(forced), 0)]
    return chosen if len(chosen) >= req.nodes else None


def give_back(free: Free | None, alloc: NodeAllocation) -> None:
    """Return an allocation's resources to a node's free capacity (a run that is ending)."""
    if free is None:
        return
    free.gpus = sorted(free.gpus + list(alloc.gpus))
    free.cpus += alloc.cpus
    free.mem_mb += alloc.mem_mb


def take(free: Free, req: Request) -> NodeAllocation:
    """Take one node's part of the request from its free capacity: the lowest free GPU indices."""
    want = need(free, req)
    gpus, free.gpus = free.gpus[: want.gpus], free.gpus[want.gpus :]
    free.cpus -= want.cpus
    free.mem_mb -= want.mem_mb
    free.idle = False
    return NodeAllocation(node=free.name, gpus=gpus, cpus=want.cpus, mem_mb=want.mem_mb)
