"""Placement: which nodes, CPUs, memory and exact GPU indices a job gets, on a working copy of usage.

Pure and deterministic. ``Usage`` is the free capacity the planner still has in this cycle; a job
is placed on whole nodes of its partition that are up and have enough free GPUs (of the requested
type), CPUs and memory, preferring the nodes with the fewest free GPUs that still fit (best fit,
to keep whole nodes free for large jobs), ties broken by name. GPU indices are the lowest free
ones, so no index is ever given to two runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.libs.core.state import Job, Node
from corral.schemas.events import NodeAllocation


@dataclass
class Free:
    """Free capacity of one node during a planning cycle."""

    name: str  # node name
    gpus: list[int]  # free GPU indices, ascending
    cpus: int  # free CPUs
    mem_mb: int  # free memory MiB
    total_mem_mb: int  # the node's memory (for --mem=0, "all of it")
    gpu_type: str | None  # GPU model
    partitions: tuple[str, ...]  # partitions
    idle: bool = True  # nothing runs on it (for --mem=0, which takes a whole node's memory)


def free_capacity(nodes: dict[str, Node]) -> dict[str, Free]:
    """Free capacity of every node that is up."""
    out: dict[str, Free] = {}
    for name in sorted(nodes):
        node = nodes[name]
        if not node.up:
            continue
        used = set(node.used_gpus)
        out[name] = Free(
            name=name,
            gpus=[g for g in range(node.gpus) if g not in used],
            cpus=node.cpus - node.alloc_cpus,
            mem_mb=node.mem_mb - node.alloc_mem_mb,
            total_mem_mb=node.mem_mb,
            gpu_type=node.gpu_type,
            partitions=tuple(node.partitions),
            idle=not node.jobs and not node.used_gpus and node.alloc_cpus == 0 and node.alloc_mem_mb == 0,
        )
    return out


@dataclass(frozen=True)
class Request:
    """What one node of a job needs."""

    nodes: int  # number of nodes
    gpus: int  # GPUs per node
    gpu_type: str | None  # required GPU model (None: any)
    cpus: int  # CPUs per node
    mem_mb: int | None  # memory per node (None: not reserved, 0: the whole node)


def request_of(job: Job) -> Request:
    """Per-node needs of a job from its spec."""
    spec = job.spec
    nodes = max(spec.nodes, 1)
    tasks_per_node = spec.ntasks_per_node or -(-max(spec.ntasks, 1) // nodes)
    return Request(
        nodes=nodes,
        gpus=spec.gpus_per_node,
        gpu_type=spec.gpu_type,
        cpus=tasks_per_node * max(spec.cpus_per_task, 1),
        mem_mb=spec.mem_per_node_mb,
    )


def eligible(free: Free, req: Request) -> bool:
    """Whether the node is of the kind the request can use at all (GPU type)."""
    return req.gpu_type is None or req.gpus == 0 or free.gpu_type == req.gpu_type


def mem_need(free: Free, req: Request) -> int:
    """Memory the request takes on this node (``--mem=0`` takes all of it)."""
    return free.total_mem_mb if req.mem_mb == 0 else (req.mem_mb or 0)


def node_fits(free: Free, req: Request) -> bool:
    """Whether one node of the request fits the node's free capacity now."""
    if not eligible(free, req) or (req.mem_mb == 0 and not free.idle):
        return False
    return len(free.gpus) >= req.gpus and free.cpus >= req.cpus and free.mem_mb >= mem_need(free, req)


def give_back(free: Free | None, alloc: NodeAllocation) -> None:
    """Return an allocation's resources to a node's free capacity (a run that is ending)."""
    if free is None:
        return
    free.gpus = sorted(free.gpus + list(alloc.gpus))
    free.cpus += alloc.cpus
    free.mem_mb += alloc.mem_mb


def take(free: Free, req: Request) -> NodeAllocation:
    """Take one node's part of the request from its free capacity: the lowest free GPU indices."""
    mem = mem_need(free, req)
    gpus, free.gpus = free.gpus[: req.gpus], free.gpus[req.gpus :]
    free.cpus -= req.cpus
    free.mem_mb -= mem
    free.idle = False
    return NodeAllocation(node=free.name, gpus=gpus, cpus=req.cpus, mem_mb=mem)


def could_ever_fit(nodes: list[Free], req: Request) -> bool:
    """Whether the request fits these nodes when they are completely idle."""
    return sum(1 for n in nodes if node_fits(n, req)) >= req.nodes


def place(free: dict[str, Free], partition: str, req: Request) -> list[NodeAllocation] | None:
    """Choose nodes for ``req`` in ``partition`` and take their capacity from ``free``.

    Returns the allocation (first node runs the batch script), or None if it does not fit now.
    """
    candidates = [f for f in free.values() if partition in f.partitions and node_fits(f, req)]
    if len(candidates) < req.nodes:
        return None
    candidates.sort(key=lambda f: (len(f.gpus), f.cpus, f.name))
    return [take(f, req) for f in sorted(candidates[: req.nodes], key=lambda f: f.name)]
