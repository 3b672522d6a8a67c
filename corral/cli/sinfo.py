"""``sinfo``: partitions and nodes, grouped as Slurm groups them.

Partition-oriented (default): per partition, nodes that print the same for every per-node field of the
format (state, CPUs, GRES ...) share one line, whose ``%D``, ``%N`` and ``%C`` sum them up. ``-N``: one line
per node and partition. Rendering is a pure function of the ``nodes`` reply: ``render_sinfo``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from corral.cli.errors import CliError, run_command
from corral.cli.fields import Layout, parse_layout, render_layout
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported, version_text
from corral.libs.slurm import hostlist
from corral.libs.slurm.gres import format_node_gres
from corral.libs.slurm.timefmt import format_elapsed

if TYPE_CHECKING:
    from corral.schemas.api import NodeInfo, NodesReply, PartitionInfo

COMMAND = "sinfo"
DEFAULT_FORMAT = "%9P %.5a %.10l %.6D %.6t %N"
NODE_FORMAT = "%#N %.6D %#P %6t"
#: ``-l`` (Slurm 22.05's, with the width of the default format's partition column) and ``-N -l``.
LONG_FORMAT = "%9P %.5a %.10l %.10s %.4r %.8h %.10g %.6D %.11T %N"
NODE_LONG_FORMAT = "%#N %.6D %#P %.11T %.4c %.8z %.6m %.8d %.6w %.8f %20E"
#: The line ``-l`` prints first (Slurm's print_date): the time of the report.
DATE_FORMAT = "%a %b %d %H:%M:%S %Y"

OPTIONS = OptionTable(
    [
        flag("Node", "N"),
        Opt("partition", "p"),
        flag("noheader", "h"),
        Opt("format", "o"),
        flag("all", "a"),
        Opt("states", "t"),
        Opt("nodes", "n"),
        flag("list-reasons", "R"),
        flag("summarize", "s"),
        flag("long", "l"),
        flag("help"),
        flag("usage"),
        flag("version", "V"),
        *unsupported(
            "Format/O exact/e responding/r dead/d iterate/i "
            "clusters/M sort/S reservation/T verbose/v json yaml federation local noconvert hide "
            "future/F"
        ),
    ]
)

USAGE = """\
Usage: sinfo [OPTIONS...]
  -N, --Node             one line per node and partition
  -p, --partition=NAMES  only these partitions
  -h, --noheader         no header line
  -t, --states=STATES    only nodes in these states (idle,mix,alloc,down,drain,...)
  -n, --nodes=HOSTS      only these nodes (hostlist, e.g. node[1-2])
  -R, --list-reasons     why nodes are down or drained   -s, --summarize   node counts per partition
  -l, --long             more columns (job size, root, oversubscribe, groups; with -N: S:C:T, memory,
                         tmp disk, weight, features, reason), after the date
  -o, --format=FORMAT    %-fields: %P %a %l %D %t %T %N %C %F %G %c %m %E %u %H %s %r %h %g %z %d %w %f,
                         widths like %.6D, %#N
"""
SUMMARIZE_FORMAT = "%9P %.5a %.10l %.16F  %N"
REASONS_FORMAT = "%20E %9u %19H %N"
#: The states ``-R`` lists: every node with a reason (draining ones count as drained).
REASON_STATES = frozenset({"down", "drained", "unknown"})
#: Slurm's TIMESTAMP (``%H``) format, local time.
TIMESTAMP = "%Y-%m-%dT%H:%M:%S"

#: (State, compact state) of a node, by the state the scheduler reports.
NODE_STATES: dict[str, tuple[str, str]] = {
    "idle": ("IDLE", "idle"),
    "mixed": ("MIXED", "mix"),
    "allocated": ("ALLOCATED", "alloc"),
    "reserved": ("RESERVED", "resv"),
    "down": ("DOWN*", "down*"),
    "drained": ("DRAINED", "drain"),
    "draining": ("DRAINING", "drng"),
    "unknown": ("UNKNOWN*", "unk*"),
}

#: Fields of the partition: header and value.
PARTITION_FIELDS: dict[str, tuple[str, Callable[[PartitionInfo], str]]] = {
    "P": ("PARTITION", lambda p: p.name + ("*" if p.default else "")),
    "a": ("AVAIL", lambda p: "up"),
    "l": ("TIMELIMIT", lambda p: "infinite" if p.max_time_s is None else format_elapsed(p.max_time_s)),
    # Corral's partitions have no node-count limits, root-only flag, oversubscription or group list:
    # Slurm's values for a partition without them.
    "s": ("JOB_SIZE", lambda p: "1-infinite"),
    "r": ("ROOT", lambda p: "no"),
    "h": ("OVERSUBSCRIBE", lambda p: "NO"),
    "g": ("GROUPS", lambda p: "all"),
}
#: Per-node fields: header and value; nodes of one line agree on all of them.
NODE_FIELDS: dict[str, tuple[str, Callable[[NodeInfo], str]]] = {
    "t": ("STATE", lambda n: node_state(n)[1]),
    "T": ("STATE", lambda n: node_state(n)[0].lower()),  # Slurm's sinfo prints the long state in lower case
    "G": ("GRES", lambda n: format_node_gres(n.gpu_type, n.gpus)),
    "c": ("CPUS", lambda n: str(n.cpus)),
    "m": ("MEMORY", lambda n: str(n.mem_mb)),
    "E": ("REASON", lambda n: n.reason or "none"),
    "u": ("USER", lambda n: reason_user(n)),
    "H": ("TIMESTAMP", lambda n: reason_timestamp(n)),
    # A node configured by CPUs only is, to Slurm, one core per socket and one thread per core.
    "z": ("S:C:T", lambda n: f"{n.cpus}:1:1"),
    "d": ("TMP_DISK", lambda n: "0"),
    "w": ("WEIGHT", lambda n: "1"),
    "f": ("AVAIL_FEATURES", lambda n: ",".join(n.features) or "(null)"),
}
#: Fields that sum up the nodes of a line.
GROUP_FIELDS: dict[str, tuple[str, Callable[[Sequence[NodeInfo]], str]]] = {
    "D": ("NODES", lambda nodes: str(len(nodes))),
    "N": ("NODELIST", lambda nodes: hostlist.compress(n.name for n in nodes)),
    "C": ("CPUS(A/I/O/T)", lambda nodes: cpu_summary(nodes)),
    "F": ("NODES(A/I/O/T)", lambda nodes: node_summary(nodes)),
}
_TITLES = {
    key: title for table in (PARTITION_FIELDS, NODE_FIELDS, GROUP_FIELDS) for key, (title, _) in table.items()
}
#: Letters Slurm has that Corral does not print yet.
LATER_FIELDS = "AbBeIkLMnOoRSUVXYZ"
#: What ``-t`` accepts for each node state the scheduler reports (Slurm's long and compact names).
STATE_NAMES: dict[str, str] = {
    "idle": "idle", "mix": "mixed", "mixed": "mixed", "alloc": "allocated", "allocated": "allocated",
    "resv": "reserved", "reserved": "reserved", "down": "down", "drain": "drained", "drained": "drained",
    "draining": "draining", "drng": "draining", "unk": "unknown", "unknown": "unknown",
}  # fmt: skip


def reason_user(node: NodeInfo) -> str:
    """``%u``: who set the node's reason: the admin of a drain, ``slurm`` for Corral's own, else Unknown."""
    return node.reason_user or ("slurm" if node.reason else "Unknown")


def reason_timestamp(node: NodeInfo) -> str:
    """``%H``: when the node's reason was set (Slurm's ``2024-05-01T10:00:00``), Unknown if not known."""
    if node.reason_time is None:
        return "Unknown"
    from datetime import datetime

    return datetime.fromtimestamp(node.reason_time).strftime(TIMESTAMP)


def node_state(node: NodeInfo) -> tuple[str, str]:
    """(long, compact) state of a node; a drained node still running jobs is draining."""
    state = "draining" if node.state == "drained" and node.alloc_cpus > 0 else node.state
    if state == "down" and node.admin_down:
        return ("DOWN", "down")  # downed by an admin, still responding: no "*"
    return NODE_STATES.get(state, (state.upper(), state))


def cpu_summary(nodes: Sequence[NodeInfo]) -> str:
    """``%C``: allocated/idle/other/total CPUs; a down or drained node's CPUs count as other."""
    allocated = idle = other = total = 0
    for node in nodes:
        total += node.cpus
        if node.state in ("down", "drained", "unknown"):
            other += node.cpus
        elif node.state == "draining":
            # Its jobs' CPUs are still allocated; the rest may not be used: other.
            allocated += node.alloc_cpus
            other += node.cpus - node.alloc_cpus
        else:
            allocated += node.alloc_cpus
            idle += node.cpus - node.alloc_cpus
    return f"{allocated}/{idle}/{other}/{total}"


def node_summary(nodes: Sequence[NodeInfo]) -> str:
    """``%F``: allocated (or mixed)/idle/other/total nodes; down and drained nodes count as other."""
    allocated = sum(1 for n in nodes if n.state in ("allocated", "mixed"))
    idle = sum(1 for n in nodes if n.state in ("idle", "reserved"))
    return f"{allocated}/{idle}/{len(nodes) - allocated - idle}/{len(nodes)}"


def parse_node_states(items: Sequence[str]) -> set[str]:
    """The node states of ``-t`` (as the scheduler reports them); CliError names an unknown one."""
    states = set()
    for item in items:
        name = item.strip().lower().rstrip("*")
        if name not in STATE_NAMES:
            raise CliError(f"invalid node state specified: {item}")
        states.add(STATE_NAMES[name])
    return states


def with_states(reply: NodesReply, states: set[str]) -> NodesReply:
    """The reply without the nodes whose state is not one of ``states`` (all of them if empty).

    ``drained`` matches draining nodes too (Slurm's ``-t drain`` is the drain flag); ``draining`` only those.
    """
    if not states:
        return reply
    import msgspec

    wanted = set(states) | ({"draining"} if "drained" in states else set())
    return msgspec.structs.replace(reply, nodes=[n for n in reply.nodes if n.state in wanted])


def parse_nodes(hostlists: Sequence[str]) -> set[str]:
    """The node names of ``-n`` hostlists; FormatError (printed as is) if one is malformed."""
    return {name for text in hostlists for name in hostlist.expand(text, "--nodes")}


def with_nodes(reply: NodesReply, names: set[str]) -> NodesReply:
    """The reply with only these nodes (all of them if empty)."""
    if not names:
        return reply
    import msgspec

    return msgspec.structs.replace(reply, nodes=[n for n in reply.nodes if n.name in names])


def parse_format(text: str | None, node_oriented: bool, long: bool = False) -> Layout:
    """The layout of ``-o`` (or the default one, ``-l``'s with ``long``)."""
    if long:
        default = NODE_LONG_FORMAT if node_oriented else LONG_FORMAT
    else:
        default = NODE_FORMAT if node_oriented else DEFAULT_FORMAT
    letters = [*PARTITION_FIELDS, *NODE_FIELDS, *GROUP_FIELDS]
    return parse_layout(text or default, "--format", letters, LATER_FIELDS)


def render_sinfo(
    reply: NodesReply,
    layout: Layout,
    *,
    header: bool = True,
    node_oriented: bool = False,
    partitions: Sequence[str] = (),
) -> list[str]:
    """The output lines for a ``nodes`` reply; ``partitions`` limits the partitions shown."""
    by_name = {node.name: node for node in reply.nodes}
    keys = [spec.key for spec in layout.fields]
    rows: list[list[str]] = []
    for partition in reply.partitions:
        if partitions and partition.name not in partitions:
            continue
        members = [by_name[name] for name in partition.nodes if name in by_name]
        groups = [[node] for node in members] if node_oriented else _group(members, keys)
        if not groups and not node_oriented and not (set(keys) & NODE_ONLY):
            rows.append([_empty_value(key, partition) for key in keys])
        for group in groups:
            rows.append([_value(key, group, partition) for key in keys])
    return render_layout(layout, [_TITLES[key] for key in keys], rows, header=header)


#: Fields that make a line about nodes: a partition without (matching) nodes gets no line for them.
NODE_ONLY = frozenset({"E"})


def _group(nodes: Sequence[NodeInfo], keys: Sequence[str]) -> list[list[NodeInfo]]:
    """Nodes that agree on every per-node field, in the order their first node comes."""
    groups: dict[tuple[str, ...], list[NodeInfo]] = {}
    for node in nodes:
        signature = tuple(NODE_FIELDS[key][1](node) for key in keys if key in NODE_FIELDS)
        groups.setdefault(signature, []).append(node)
    return list(groups.values())


def _value(key: str, nodes: Sequence[NodeInfo], partition: PartitionInfo) -> str:
    if key in PARTITION_FIELDS:
        return PARTITION_FIELDS[key][1](partition)
    if key in GROUP_FIELDS:
        return GROUP_FIELDS[key][1](nodes)
    return NODE_FIELDS[key][1](nodes[0])


def _empty_value(key: str, partition: PartitionInfo) -> str:
    """A field of a partition without nodes: what Slurm prints for it."""
    if key in PARTITION_FIELDS:
        return PARTITION_FIELDS[key][1](partition)
    return {"D": "0", "N": "", "C": "0/0/0/0"}.get(key, "n/a")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sinfo``."""
    return run_command(COMMAND, _sinfo, argv)


def _sinfo(argv: list[str]) -> int:
    args = OPTIONS.parse(argv)
    if args.positionals:
        raise CliError(f"unrecognized argument '{args.positionals[0]}'")
    if args.given("help") or args.given("usage") or args.given("version"):
        sys.stdout.write(USAGE if not args.given("version") else version_text() + "\n")
        return 0
    node_oriented = args.given("Node")
    text = args.last("format")
    if text is None and args.given("summarize"):
        text = SUMMARIZE_FORMAT
    if text is None and args.given("list-reasons"):
        text = REASONS_FORMAT
    layout = parse_format(text, node_oriented, args.given("long"))
    partitions = args.items("partition")
    states = parse_node_states(args.items("states"))
    only_nodes = parse_nodes(args.all("nodes"))
    if args.given("list-reasons") and not states:
        states = set(REASON_STATES)
    from corral.cli.client import find_cluster
    from corral.schemas.api import NodesRequest

    reply = find_cluster().nodes(NodesRequest(partitions=partitions))
    reply = with_nodes(with_states(reply, states), only_nodes)
    lines = render_sinfo(
        reply, layout, header=not args.given("noheader"), node_oriented=node_oriented, partitions=partitions
    )
    if args.given("long"):
        import time

        lines.insert(0, time.strftime(DATE_FORMAT))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
