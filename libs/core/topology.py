"""Topology: nodes grouped into blocks (an NVLink domain, a leaf switch) and which blocks a job's nodes use.

Pure. The block map is configuration (``[[blocks]]``, carried by ``Policy.blocks``): node name -> block
name; a node in no block is a block of its own, so a cluster without blocks is all one-node blocks and
``choose`` is exactly ``placement.pick`` there (nothing is grouped, nothing is slower).

``choose(fit, req, blocks, free_of)`` picks ``req.nodes`` nodes among ``fit`` (the nodes that can host
one node of the job, in the caller's order of preference), counting in units of ``req.segment`` nodes
(``--segment``: every segment inside one block; 1 without it):

1. every ``-w`` node is part of the selection, so its block is used (with as many segments as its
   listed nodes need), and the spare room of such a block is filled first: it costs no extra block;
2. then, while nodes are missing: if one block can hold all of the rest, the one with the least room
   that still does (best fit: whole blocks stay free for the large jobs), and for a single-node job a
   partly used block before a wholly idle one whatever their room; otherwise the block with the most
   room (so the job spans the fewest blocks);
3. ties between blocks of equal room: a partly used block first, then fewer free GPUs, then fewer free
   CPUs (the more used block), then the caller's preference (its best node first);
4. ``--switches=N`` (``req.switches``): a selection over more than N blocks is refused (the job waits
   with reason Resources) until the switch wait ends (``switch_deadline``), then the rule is dropped.

Within a block the nodes are taken in the caller's order. Largest-first always reaches the smallest
possible number of blocks; the best-fit last step keeps that number.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from corral.libs.core.placement import Free, Request, node_fits, pick
from corral.libs.core.state import Job
from corral.schemas.events import JobSpec

T = TypeVar("T")

#: Node name -> block name; a node missing from it is a block of its own.
Blocks = Mapping[str, str]


@dataclass(frozen=True)
class Topology:
    """The block map and each block's size (built once per planning cycle)."""

    blocks: Blocks  # node -> block name
    sizes: dict[str, int]  # block name -> its number of nodes

    @classmethod
    def of(cls, blocks: Blocks) -> Topology:
        """The topology of a block map."""
        sizes: dict[str, int] = {}
        for block in blocks.values():
            sizes[block] = sizes.get(block, 0) + 1
        return cls(blocks, sizes)

    def whole(self, key: tuple[bool, str], nodes: Sequence[Free]) -> bool:
        """Whether ``nodes`` are all of block ``key`` and all idle: nothing of the block is used."""
        size = self.sizes.get(key[1], 0) if key[0] else 1
        return len(nodes) == size and all(n.idle for n in nodes)


def switch_wait_s(spec: JobSpec, max_wait_s: int) -> int:
    """How long a job waits for its ``--switches`` count: its ``@wait``, at most max_switch_wait."""
    return max_wait_s if spec.switches_wait_s is None else min(spec.switches_wait_s, max_wait_s)


def switch_deadline(job: Job, max_wait_s: int) -> float | None:
    """When a job's ``--switches`` stops binding (Slurm's wait4switch, capped by max_switch_wait).

    The wait counts from when the job could first start: its submission, or its begin time if later.
    None if the job asked for no switch count.
    """
    spec = job.spec
    if spec.switches is None:
        return None
    return max(job.submit_time, spec.begin_time or 0.0) + switch_wait_s(spec, max_wait_s)


def in_force(req: Request, job: Job, now: float, max_wait_s: int) -> Request:
    """The request with its ``--switches`` dropped once the job has waited long enough for it."""
    deadline = switch_deadline(job, max_wait_s)
    return msgspec.structs.replace(req, switches=None) if deadline is not None and now >= deadline else req


def block_of(blocks: Blocks, node: str) -> tuple[bool, str]:
    """The key of a node's block: (True, block name), or (False, node name) for a node in no block."""
    block = blocks.get(node)
    return (True, block) if block is not None else (False, node)


def choose(fit: Sequence[T], req: Request, topo: Topology, free_of: Callable[[T], Free]) -> list[T] | None:
    """The nodes of ``fit`` (in order of preference) to give ``req``, by the rules of the module
    docstring; None if the job cannot be placed on them."""
    seg = req.segment
    if req.nodes % seg:
        return None
    blocks = topo.blocks
    if not blocks:
        # Every node is its own block: a segment of several nodes fits none, N nodes span N blocks.
        if seg > 1 or (req.switches is not None and req.switches < req.nodes):
            return None
        if not req.nodelist:  # what ``pick`` does without -w, without a call per node
            return list(fit[: req.nodes]) if len(fit) >= req.nodes else None
        return pick(fit, req, lambda n: free_of(n).name)
    groups: dict[tuple[bool, str], list[T]] = {}
    for node in fit:
        groups.setdefault(block_of(blocks, free_of(node).name), []).append(node)
    listed = set(req.nodelist)
    room = {key: len(nodes) // seg for key, nodes in groups.items()}
    taken: dict[tuple[bool, str], int] = {}  # block -> segments taken from it, in the order chosen
    for key, nodes in groups.items():
        forced = sum(1 for n in nodes if free_of(n).name in listed)
        if forced:
            taken[key] = -(-forced // seg)
            if taken[key] > room[key]:
                return None
    if sum(1 for n in fit if free_of(n).name in listed) < len(listed):
        return None  # a listed node cannot host the job
    missing = req.nodes // seg - sum(taken.values())
    for key in list(taken):
        extra = min(room[key] - taken[key], max(missing, 0))
        taken[key] += extra
        missing -= extra
    if missing < 0:
        return None  # the listed nodes alone need more segments than the job has
    missing = _add_blocks(topo, groups, room, taken, missing, free_of, req.nodes == 1)
    if missing > 0 or (req.switches is not None and len(taken) > req.switches):
        return None
    out: list[T] = []
    for key, count in taken.items():
        nodes = groups[key]
        first = [n for n in nodes if free_of(n).name in listed]
        out += first + [n for n in nodes if free_of(n).name not in listed][: count * seg - len(first)]
    return out


def _add_blocks(
    topo: Topology,
    groups: dict[tuple[bool, str], list[T]],
    room: dict[tuple[bool, str], int],
    taken: dict[tuple[bool, str], int],
    missing: int,
    free_of: Callable[[T], Free],
    single: bool,
) -> int:
    """Add blocks to ``taken`` for ``missing`` more segments (steps 2-3); the segments still missing."""
    rank = {key: index for index, key in enumerate(groups)}

    def used(key: tuple[bool, str]) -> tuple[bool, int, int, int]:
        free = [free_of(n) for n in groups[key]]
        gpus = sum(len(f.gpus) for f in free)
        return topo.whole(key, free), gpus, sum(f.cpus for f in free), rank[key]

    keys = {k: used(k) for k in groups if k not in taken and room[k] > 0}
    # A single-node job goes to a partly used block before an idle one whatever their room.
    spare = sorted(keys, key=lambda k: (single and keys[k][0], room[k], keys[k]))
    while missing > 0 and spare:
        fitting = next((k for k in spare if room[k] >= missing), None)
        if fitting is None:
            most = max(room[k] for k in spare)
            fitting = min((k for k in spare if room[k] == most), key=lambda k: keys[k])
        spare.remove(fitting)
        taken[fitting] = min(room[fitting], missing)
        missing -= taken[fitting]
    return missing


def fits_idle(nodes: list[Free], req: Request, blocks: Blocks) -> bool:
    """Whether the request fits these nodes, and their blocks, when they are completely idle."""
    return choose([n for n in nodes if node_fits(n, req)], req, Topology.of(blocks), _itself) is not None


def block_sizes(nodes: list[Free], req: Request, blocks: Blocks) -> list[int]:
    """How many of these idle nodes can host one node of ``req``, per block (largest first)."""
    count: dict[tuple[bool, str], int] = {}
    for node in nodes:
        if node_fits(node, req):
            block = block_of(blocks, node.name)
            count[block] = count.get(block, 0) + 1
    return sorted(count.values(), reverse=True)


def _itself(free: Free) -> Free:
    return free
