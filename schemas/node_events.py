"""The events of nodes (on ``corral.evt.node.<node>.<tag>``): an agent's registration, health's facts (down,
up, drained, resumed) and the gateway's admin intents that health answers.
"""

from __future__ import annotations

import msgspec

from corral.schemas.ids import NodeName


class NodeRegistered(msgspec.Struct, frozen=True, tag="node_registered", kw_only=True):
    """Fact (agent): a node's inventory; the node is UP from here."""

    node: NodeName  # node name (must resolve on the cluster's machines)
    cpus: int  # CPUs
    mem_mb: int  # memory in MiB
    gpus: int = 0  # number of GPUs
    gpu_type: str | None = None  # GPU model, e.g. "h100"
    partitions: list[str] = []  # partitions the node belongs to (from the cluster config)
    features: list[str] = []  # node features for --constraint
    boot_id: str = ""  # identifies one agent process lifetime
    drain_reason: str = ""  # set: the node registers DRAINED (e.g. a GPU count mismatch); "" = usable


class NodeDown(msgspec.Struct, frozen=True, tag="node_down", kw_only=True):
    """Fact (health): the node stopped responding, or an admin downed it; its runs end (requeued or
    NODE_FAIL). An admin's down (``by`` set) leaves the node's agent running: what still runs there is
    killed through it, and the node stays down, whatever its heartbeats and registrations, until
    ``NodeResumed``."""

    node: NodeName  # the node
    reason: str  # e.g. "Not responding", or the admin's Reason= (shown by sinfo -R)
    by: str = ""  # the admin who downed it (scontrol update State=DOWN); "" = it stopped responding


class NodeUp(msgspec.Struct, frozen=True, tag="node_up", kw_only=True):
    """Fact (health): a node that was down responds again."""

    node: NodeName  # the node


#: Longest reason an admin may give for draining a node (Slurm keeps reasons short, one line).
MAX_NODE_REASON = 256


class NodeDrainRequested(msgspec.Struct, frozen=True, tag="node_drain_requested", kw_only=True):
    """Intent (gateway): an admin asked to drain a node (``scontrol update NodeName= State=DRAIN``).

    Health answers it with ``NodeDrained``; the scheduler folds only the fact.
    """

    node: NodeName  # the node (one per entry: a hostlist is one intent per node)
    user: str  # the admin who asked (authenticated)
    reason: str  # Reason=, required, one line of at most MAX_NODE_REASON characters


class NodeResumeRequested(msgspec.Struct, frozen=True, tag="node_resume_requested", kw_only=True):
    """Intent (gateway): an admin asked to resume a drained node (``State=RESUME`` or ``UNDRAIN``).

    Health answers it with ``NodeResumed``.
    """

    node: NodeName  # the node
    user: str  # the admin who asked (authenticated)


class NodeDownRequested(msgspec.Struct, frozen=True, tag="node_down_requested", kw_only=True):
    """Intent (gateway): an admin asked to down a node (``scontrol update NodeName= State=DOWN``).

    Health answers it with ``NodeDown(by=...)``; the scheduler folds only the fact.
    """

    node: NodeName  # the node (one per entry)
    user: str  # the admin who asked (authenticated)
    reason: str  # Reason=, required, one line of at most MAX_NODE_REASON characters


class NodeDrained(msgspec.Struct, frozen=True, tag="node_drained", kw_only=True):
    """Fact (health): the node is drained by an admin: running jobs finish, no new job is placed on it.

    Separate from a registration's ``drain_reason``: a re-registration (agent restart) keeps it; only
    ``NodeResumed`` ends it. Draining a drained node again replaces the reason.
    """

    node: NodeName  # the node
    reason: str  # the admin's Reason= (sinfo -R, scontrol show node)
    by: str  # the admin who asked (shown as ``Reason=text [by@time]``)


class NodeResumed(msgspec.Struct, frozen=True, tag="node_resumed", kw_only=True):
    """Fact (health): an admin resumed the node: its admin drain and its registration drain end.

    A registration drain (GPU count mismatch) comes back at the agent's next registration if the
    mismatch is still there, as in Slurm.
    """

    node: NodeName  # the node
    by: str  # the admin who asked


#: The events of nodes (on ``corral.evt.node.<node>.<tag>``).
NODE_EVENTS = (
    NodeRegistered,
    NodeDown,
    NodeUp,
    NodeDrainRequested,
    NodeResumeRequested,
    NodeDrained,
    NodeResumed,
    NodeDownRequested,
)
NodeEvent = (
    NodeRegistered
    | NodeDown
    | NodeUp
    | NodeDrainRequested
    | NodeResumeRequested
    | NodeDrained
    | NodeResumed
    | NodeDownRequested
)
