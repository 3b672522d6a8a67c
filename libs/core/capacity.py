"""What a planning cycle starts from, kept across cycles: each node's free capacity.

``placement.free_capacity`` builds a ``Free`` for every node in every cycle, most of them unchanged since
the last one (a cycle follows a few events: a submission, an exit, an allocation). ``CapacityCache`` keeps
the ``Free`` it built for each node with everything it was built from, and builds again only the nodes
whose registration, health or usage changed since. The cycle gets the kept ones themselves: whatever
changes one in a cycle replaces it with a copy first (``Planner._take``, ``plan._capacity``'s exits).

What it was built from is compared by value (the node's lists too), not by identity or by a version the
fold would have to keep: whatever changes a node, and however, its ``Free`` is built again. Equal to
``free_capacity`` for every state (``tests/unit/test_capacity_cache.py``, and the simulator's runs with and
without it).
"""

from __future__ import annotations

from corral.libs.core.placement import Free, free_capacity
from corral.libs.core.state import Node

#: What a node's ``Free`` is built from: its fields that ``free_capacity`` reads (``jobs`` as a flag).
Basis = tuple[object, ...]


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
