"""The memory cgroups of this node's runs (Slurm's task/cgroup with ``ConstrainRAMSpace``).

With ``[cluster] constrain_ram_space = true`` each run gets a memory cgroup of its own (``memcg.py``)
limited to the memory the run was allocated on this node, or to the node's configured memory when the job
asked for none. The agent creates it before it starts the run's supervisor, which puts the batch script in
it (the batch step's ``cgroup_procs``, ``stepd.py``); srun's tasks on this node join it too (``stepd.py``).
Its path is written to
``<run dir>/cgroup`` *before* it is created, so whoever finds the run ended — the supervisor, the agent after
a restart, ``corral up``'s stop — can remove it. Where no memory cgroup is usable the runs go unconfined
(said once in the log) and their OOM is unknown: a job never fails to launch for want of a cgroup.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from corral.libs.config.cluster import ClusterConfig, NodeConfig
from corral.schemas.api import LaunchOrder
from corral.services.agent import memcg

#: The run directory's file naming the run's cgroup.
CGROUP_FILE = "cgroup"


def memory_limit_mb(order: LaunchOrder, node: NodeConfig) -> int:
    """The memory a run may use on ``node``: its allocation there, else (no ``--mem``) the node's memory."""
    alloc = next((a for a in order.allocations if a.node == node.name), None)
    return (alloc.mem_mb if alloc is not None else 0) or node.mem_mb


def recorded_cgroup(run_dir: Path) -> str | None:
    """The cgroup path a run directory names, if any."""
    try:
        return (run_dir / CGROUP_FILE).read_text().strip() or None
    except OSError:
        return None


def release(run_dir: Path) -> bool:
    """Kill what is left in the run's cgroup and remove it (blocking, briefly); True when none is left."""
    path = recorded_cgroup(run_dir)
    return path is None or memcg.remove(path)


class RunCgroups:
    """The run cgroups of one node (``confinement`` None: runs go unconfined)."""

    def __init__(self, confinement: memcg.Confinement | None, tag: str, node: NodeConfig, log: Any) -> None:
        self.confinement = confinement
        self.tag = tag  # prefix of this agent's cgroup names
        self.node = node
        self.log = log

    @classmethod
    def probe(cls, config: ClusterConfig, node: NodeConfig, state_dir: Path, log: Any) -> RunCgroups:
        """Find out once whether runs can be confined here, and say so in the log."""
        tag = memcg.cluster_tag(config.name, str(state_dir))
        if not config.constrain_ram_space:
            return cls(None, tag, node, log)
        confinement, why = memcg.probe(config.cgroup_root)
        if confinement is None:
            log.warning("runs are not memory-confined; OOM kills are not reported", reason=why)
        else:
            log.info("runs are memory-confined", cgroups=confinement.root, via=why)
        return cls(confinement, tag, node, log)

    def create(self, order: LaunchOrder, run_dir: Path) -> str | None:
        """Make the run's cgroup, limited to its memory on this node; its path, or None (unconfined)."""
        if self.confinement is None:
            return None
        name = memcg.run_name(self.tag, self.node.name, order.job_id, order.attempt)
        path = self.confinement.path(name)
        run_dir.mkdir(parents=True, exist_ok=True)
        # Recorded before it exists: a crash right after mkdir must not leave a cgroup nobody knows of.
        (run_dir / CGROUP_FILE).write_text(path + "\n")
        try:
            return self.confinement.create(name, memcg.limit_bytes(memory_limit_mb(order, self.node)))
        except memcg.CgroupError as exc:
            self.log.warning("run not memory-confined", job_id=order.job_id, error=str(exc))
            return None

    def of(self, run_dir: Path) -> str | None:
        """The cgroup of a run of this node, if it has one now (steps' tasks join it)."""
        path = recorded_cgroup(run_dir)
        return path if path is not None and os.path.isdir(path) else None

    def sweep(self, keep: set[str]) -> None:
        """Remove this agent's cgroups that belong to no unfinished run (left by a crash mid-cleanup)."""
        if self.confinement is None:
            return
        for path in self.confinement.children(self.tag + "_"):
            if path not in keep:
                memcg.remove(path)
