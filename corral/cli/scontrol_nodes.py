"""``scontrol show node|partition [NAME]`` (Slurm's key=value records) and ``scontrol update NodeName=``.

Rendering is pure (``show_node``, ``show_partition``) over the ``nodes`` reply sinfo uses too: every field
Slurm 22.05 prints, in its order, those Corral does not measure with Slurm's unset values. A drained
node shows ``State=IDLE+DRAIN`` (``MIXED+DRAIN``/``ALLOCATED+DRAIN`` while jobs still run, ``DOWN*+DRAIN``)
and an admin's reason as ``Reason=text [user@time]``, as Slurm does.

``scontrol update NodeName=LIST State=DRAIN|DOWN Reason=TEXT`` and ``State=RESUME|UNDRAIN`` (admins only):
keys and states in any case; the request (pure: ``node_update_request``) goes to the gateway's
``update_node`` verb, which answers once every node is drained, downed or resumed. Prints nothing on
success, as Slurm. A downed node's running jobs are requeued (or end NODE_FAIL) and their processes are
killed through its agent; it stays DOWN (no ``*`` while it responds) until RESUME.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING

from corral.cli.errors import CliError
from corral.libs.slurm import hostlist
from corral.libs.slurm.gres import format_node_gres
from corral.libs.slurm.memory import format_memory
from corral.libs.slurm.timefmt import format_elapsed_sacct

if TYPE_CHECKING:
    from corral.schemas.api import NodeInfo, NodesReply, NodeUpdateRequest, PartitionInfo

#: scontrol's State= of each node state the scheduler reports (``*``: not responding).
NODE_STATE = {
    "idle": "IDLE",
    "mixed": "MIXED",
    "allocated": "ALLOCATED",
    "reserved": "RESERVED",
    "down": "DOWN*",
    "unknown": "UNKNOWN*",
}
#: Slurm's reason timestamp (``Reason=text [user@2024-05-01T10:00:00]``), local time.
REASON_TIME = "%Y-%m-%dT%H:%M:%S"


def _features(node: NodeInfo) -> str:
    return ",".join(node.features) or "(null)"


def node_state_text(node: NodeInfo) -> str:
    """``State=`` of a node: its base state, ``+DRAIN`` when drained (IDLE, MIXED or ALLOCATED by usage)."""
    if node.state not in ("drained", "draining"):
        state = NODE_STATE.get(node.state, node.state.upper())
        if node.state == "down" and node.admin_down:
            state = "DOWN"  # downed by an admin, still responding: no "*"
        return state + "+DRAIN" if node.drained and node.state == "down" else state
    if not node.alloc_cpus:
        return "IDLE+DRAIN"
    full = node.alloc_cpus >= node.cpus or (node.gpus > 0 and node.alloc_gpus >= node.gpus)
    return "ALLOCATED+DRAIN" if full else "MIXED+DRAIN"


def reason_text(node: NodeInfo, tz: tzinfo | None = None) -> str:
    """``Reason=`` of a node: the reason, with ``[user@time]`` when an admin set it."""
    if not node.reason_user or node.reason_time is None:
        return node.reason
    at = datetime.fromtimestamp(node.reason_time, tz).strftime(REASON_TIME)
    return f"{node.reason} [{node.reason_user}@{at}]"


def show_node(node: NodeInfo, tz: tzinfo | None = None) -> list[str]:
    """The lines of ``scontrol show node`` for one node: Slurm 22.05's keys, order and unset values.

    A node's CPUs are Slurm's default layout for ``CPUs=N`` alone (N sockets of one core, one thread);
    what Corral does not measure prints Slurm's unset value (``CPULoad=N/A``, ``FreeMem=N/A``,
    ``CapWatts=n/a``, ``n/s`` for the energy and sensor fields); ``Arch``, ``OS`` and ``Version``, which
    Slurm omits when slurmd has not reported them, are omitted. Lines keep Slurm's trailing spaces.
    """
    state = node_state_text(node)
    gres = format_node_gres(node.gpu_type, node.gpus)
    cfg = f"cpu={node.cpus},mem={format_memory(node.mem_mb)},billing={node.cpus}"
    alloc = f"cpu={node.alloc_cpus},mem={format_memory(node.alloc_mem_mb)}" if node.alloc_cpus else ""
    if node.gpus:
        cfg += f",gres/gpu={node.gpus}"
        alloc += f",gres/gpu={node.alloc_gpus}" if alloc and node.alloc_gpus else ""
    lines = [
        f"NodeName={node.name} CoresPerSocket=1 ",
        f"CPUAlloc={node.alloc_cpus} CPUEfctv={node.cpus} CPUTot={node.cpus} CPULoad=N/A",
        f"AvailableFeatures={_features(node)}",
        f"ActiveFeatures={_features(node)}",
        f"Gres={gres}",
        f"NodeAddr={node.name} NodeHostName={node.name} ",
        f"RealMemory={node.mem_mb} AllocMem={node.alloc_mem_mb} FreeMem=N/A Sockets={node.cpus} Boards=1",
        f"State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A",
        *([f"Partitions={','.join(node.partitions)} "] if node.partitions else []),
        "BootTime=None SlurmdStartTime=None",
        "LastBusyTime=Unknown",
        f"CfgTRES={cfg}",
        f"AllocTRES={alloc}",
        "CapWatts=n/a",
        "CurrentWatts=n/s AveWatts=n/s",
        "ExtSensorsJoules=n/s ExtSensorsWatts=n/s ExtSensorsTemp=n/s",
    ]
    if node.reason:
        lines.append(f"Reason={reason_text(node, tz)}")
    return lines


def _time(seconds: int | None, none: str) -> str:
    return none if seconds is None else format_elapsed_sacct(seconds)


def show_partition(part: PartitionInfo, nodes: Sequence[NodeInfo]) -> list[str]:
    """The lines of ``scontrol show partition`` for one partition (``nodes``: its registered nodes).

    Slurm 22.05's keys and order; the settings Corral does not have print Slurm's defaults (no root or
    user exclusivity, no hidden partitions, ``OverSubscribe=NO``, ``DefMemPerNode=UNLIMITED``).
    PriorityJobFactor is the tier: Corral's one partition priority orders the queue and is the factor.
    """
    cpus = sum(n.cpus for n in nodes)
    tres = (
        f"cpu={cpus},mem={format_memory(sum(n.mem_mb for n in nodes))},node={len(part.nodes)},billing={cpus}"
    )
    gpus = sum(n.gpus for n in nodes)
    if gpus:
        tres += f",gres/gpu={gpus}"
    max_nodes = "UNLIMITED" if part.max_nodes is None else str(part.max_nodes)
    return [
        f"PartitionName={part.name}",
        f"AllowGroups=ALL AllowAccounts={','.join(part.allow_accounts) or 'ALL'} "
        f"AllowQos={','.join(part.allow_qos) or 'ALL'}",
        f"AllocNodes=ALL Default={'YES' if part.default else 'NO'} QoS={part.qos or 'N/A'}",
        f"DefaultTime={_time(part.default_time_s, 'NONE')} DisableRootJobs=NO ExclusiveUser=NO "
        f"GraceTime={part.grace_time_s} Hidden=NO",
        f"MaxNodes={max_nodes} MaxTime={_time(part.max_time_s, 'UNLIMITED')} MinNodes=0 LLN=NO "
        "MaxCPUsPerNode=UNLIMITED",
        f"Nodes={hostlist.compress(part.nodes) if part.nodes else '(null)'}",
        f"PriorityJobFactor={part.priority_tier} PriorityTier={part.priority_tier} RootOnly=NO ReqResv=NO "
        "OverSubscribe=NO",
        f"OverTimeLimit=NONE PreemptMode={part.preempt_mode}",
        f"State=UP TotalCPUs={cpus} TotalNodes={len(part.nodes)} SelectTypeParameters=NONE",
        "JobDefaults=(null)",
        "DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED",
        f"TRES={tres}",
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
    from corral.schemas.api import NodesRequest

    reply = find_cluster().nodes(NodesRequest())
    out = [
        " ".join(lines) + "\n" if oneliner else "\n   ".join(lines) + "\n\n"
        for lines in records(entity, words[0] if words else None, reply)
    ]
    sys.stdout.write("".join(out))
    return 0


#: What ``State=`` of ``scontrol update NodeName=`` asks for, by Slurm's name (UNDRAIN is a RESUME here).
UPDATE_STATES = {"drain": "DRAIN", "down": "DOWN", "resume": "RESUME", "undrain": "RESUME"}
#: Slurm's other node states an admin may set, which Corral does not implement yet.
LATER_STATES = frozenset(
    {"fail", "future", "idle", "noresp", "power_down", "power_down_asap", "power_down_force",
     "power_up", "reboot", "cancel_reboot"}
)  # fmt: skip
#: Keys of ``scontrol update NodeName=`` Corral knows (``nodename``/``node`` name the nodes).
UPDATE_KEYS = frozenset({"nodename", "node", "state", "reason"})


def node_update_request(words: Sequence[str]) -> NodeUpdateRequest:
    """The request of ``scontrol update NodeName=LIST State=DRAIN Reason=TEXT`` (or ``State=RESUME``)."""
    from corral.schemas.api import NodeUpdateRequest

    values: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise CliError(f"scontrol update {word}: use KEY=VALUE (NodeName=, State=, Reason=)")
        name = key.lower()
        if name not in UPDATE_KEYS:
            raise CliError(f"scontrol update: changing {key} of a node is not supported by Corral yet")
        values["nodename" if name == "node" else name] = value
    names = hostlist.expand(values.get("nodename", ""), "NodeName")
    if not names:
        raise CliError("scontrol update needs NodeName=LIST (e.g. NodeName=node[1-2])")
    text = values.get("state")
    if text is None:
        raise CliError("scontrol update NodeName= needs State=DRAIN Reason=TEXT or State=RESUME")
    state = UPDATE_STATES.get(text.lower())
    reason = values.get("reason", "").strip()
    if text.lower() in ("drain", "down") and not reason:
        raise CliError("You must specify a reason when DOWNING or DRAINING a node. Request denied")
    if state is None and text.lower() in LATER_STATES:
        raise CliError(
            f"State={text} is not supported by Corral yet: use State=DRAIN (running jobs finish, "
            "nothing new starts), State=DOWN (running jobs are requeued or end NODE_FAIL) or State=RESUME"
        )
    if state is None:
        raise CliError(f"Invalid input: State={text}: use DRAIN, DOWN, RESUME or UNDRAIN")
    return NodeUpdateRequest(
        nodes=names,
        state="DRAIN" if state == "DRAIN" else "DOWN" if state == "DOWN" else "RESUME",
        reason=reason,
    )


def update(words: Sequence[str]) -> int:
    """Carry out ``scontrol update NodeName=...``; silent on success, as Slurm."""
    from corral.cli.client import find_cluster
    from corral.schemas.api import NodeUpdateReply

    find_cluster().call("update_node", node_update_request(words), NodeUpdateReply)
    return 0
