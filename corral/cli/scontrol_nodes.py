"""``scontrol show node [NAME]`` and ``scontrol show partition [NAME]``: Slurm's key=value records.

Rendering is pure (``show_node``, ``show_partition``) over the ``nodes`` reply sinfo uses too; only the
fields Corral knows are printed (no Arch, load, sockets or free memory it does not measure).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from corral.cli.errors import CliError
from corral.libs.slurm import hostlist
from corral.libs.slurm.gres import format_node_gres
from corral.libs.slurm.memory import format_memory
from corral.libs.slurm.timefmt import format_elapsed_sacct

if TYPE_CHECKING:
    from corral.schemas.api import NodeInfo, NodesReply, PartitionInfo

#: scontrol's State= of each node state the scheduler reports (``*``: not responding).
NODE_STATE = {
    "idle": "IDLE",
    "mixed": "MIXED",
    "allocated": "ALLOCATED",
    "reserved": "RESERVED",
    "down": "DOWN*",
    "drained": "IDLE+DRAIN",
    "unknown": "UNKNOWN*",
}


def _features(node: NodeInfo) -> str:
    return ",".join(node.features) or "(null)"


def show_node(node: NodeInfo) -> list[str]:
    """The lines of ``scontrol show node`` for one node (Slurm's keys, in Slurm's order)."""
    state = NODE_STATE.get(node.state, node.state.upper())
    if node.state == "drained" and node.alloc_cpus:
        state = "MIXED+DRAIN"
    gres = format_node_gres(node.gpu_type, node.gpus)
    cfg = f"cpu={node.cpus},mem={format_memory(node.mem_mb)},billing={node.cpus}"
    alloc = f"cpu={node.alloc_cpus},mem={format_memory(node.alloc_mem_mb)}" if node.alloc_cpus else ""
    if node.gpus:
        cfg += f",gres/gpu={node.gpus}"
        alloc += f",gres/gpu={node.alloc_gpus}" if alloc and node.alloc_gpus else ""
    lines = [
        f"NodeName={node.name} CoresPerSocket=1",
        f"CPUAlloc={node.alloc_cpus} CPUEfctv={node.cpus} CPUTot={node.cpus}",
        f"AvailableFeatures={_features(node)}",
        f"ActiveFeatures={_features(node)}",
        f"Gres={gres}",
        f"NodeAddr={node.name} NodeHostName={node.name}",
        f"RealMemory={node.mem_mb} AllocMem={node.alloc_mem_mb}",
        f"State={state} ThreadsPerCore=1 Weight=1",
        f"Partitions={','.join(node.partitions)}",
        f"CfgTRES={cfg}",
        f"AllocTRES={alloc}",
    ]
    if node.reason:
        lines.append(f"Reason={node.reason}")
    return lines


def _time(seconds: int | None, none: str) -> str:
    return none if seconds is None else format_elapsed_sacct(seconds)


def show_partition(part: PartitionInfo, nodes: Sequence[NodeInfo]) -> list[str]:
    """The lines of ``scontrol show partition`` for one partition (``nodes``: its registered nodes)."""
    return [
        f"PartitionName={part.name}",
        "AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL",
        f"Default={'YES' if part.default else 'NO'}",
        f"DefaultTime={_time(part.default_time_s, 'NONE')} MaxTime={_time(part.max_time_s, 'UNLIMITED')}",
        f"Nodes={hostlist.compress(part.nodes) if part.nodes else '(null)'}",
        f"State=UP TotalCPUs={sum(n.cpus for n in nodes)} TotalNodes={len(part.nodes)}",
    ]


def records(entity: str, name: str | None, reply: NodesReply) -> list[list[str]]:
    """The records of ``show node|partition [NAME]``; CliError with Slurm's wording when NAME is unknown."""
    by_name = {n.name: n for n in reply.nodes}
    if entity == "node":
        wanted = hostlist.expand(name) if name else list(by_name)
        missing = [n for n in wanted if n not in by_name]
        if missing:
            raise CliError(f"Node {missing[0]} not found")
        return [show_node(by_name[n]) for n in wanted]
    parts = [p for p in reply.partitions if name is None or p.name == name]
    if name is not None and not parts:
        raise CliError(f"Partition {name} not found")
    return [show_partition(p, [by_name[n] for n in p.nodes if n in by_name]) for p in parts]


def show(entity: str, words: Sequence[str], oneliner: bool) -> int:
    """Print ``scontrol show node|partition [NAME]``."""
    if len(words) > 1:
        raise CliError(f"unexpected argument '{words[1]}'")
    from corral.cli.client import find_cluster
    from corral.schemas.api import NodesReply, NodesRequest

    reply = find_cluster().call("nodes", NodesRequest(), NodesReply)
    out = [
        " ".join(lines) + "\n" if oneliner else "\n   ".join(lines) + "\n\n"
        for lines in records(entity, words[0] if words else None, reply)
    ]
    sys.stdout.write("".join(out))
    return 0
