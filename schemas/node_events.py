"""The events of nodes (on ``corral.evt.node.<node>.<tag>``): an agent's registration, health's facts (down,
up, drained, resumed) and the gateway's admin intents that health answers.
"""

from __future__ import annotations

from typing import Annotated, Literal

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
    by: str  # the admin who asked (shown as ``Reason=text [by@time]``), or the reporter of a failing health
    # report (a service account, or the node's agent for its health-check program)
    # A failing health report's drain under ``health_failure_action = "requeue"``: the node's running jobs
    # that may be requeued are killed and requeued (the others finish); False: every job finishes.
    requeue: bool = False


class NodeResumed(msgspec.Struct, frozen=True, tag="node_resumed", kw_only=True):
    """Fact (health): an admin resumed the node: its admin drain and its registration drain end.

    A registration drain (GPU count mismatch) comes back at the agent's next registration if the
    mismatch is still there, as in Slurm.
    """

    node: NodeName  # the node
    by: str  # the admin who asked


#: What a health report's check is about: an NVIDIA XID error, ECC errors, a failing health-check program
#: (Slurm's HealthCheckProgram), a GPU count or NVLink problem, a temperature, anything else.
HealthCheckKind = Literal["xid", "ecc", "healthcheck", "gpu_count", "nvlink", "thermal", "other"]
#: Who measured it: DCGM (or an exporter like it), the agent's health-check program, NVML, another tool.
HealthSource = Literal["dcgm", "healthcheck", "nvml", "other"]
#: ``fail`` drains the node; ``warning`` and ``ok`` are recorded and change nothing.
HealthSeverity = Literal["ok", "warning", "fail"]
#: The most checks one report carries, and the longest code and message of one (a report is bounded).
MAX_HEALTH_CHECKS = 64
MAX_HEALTH_CODE = 64
MAX_HEALTH_MESSAGE = 512


class HealthCheck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One finding of a health report: e.g. XID 79 on GPU 3, or the health-check program's exit status."""

    kind: HealthCheckKind  # what it is about
    code: Annotated[str, msgspec.Meta(max_length=MAX_HEALTH_CODE)] = ""  # e.g. "79" (XID), "exit 1"
    message: Annotated[str, msgspec.Meta(max_length=MAX_HEALTH_MESSAGE)] = ""  # one line, for Reason=
    gpu: Annotated[int, msgspec.Meta(ge=0, le=1023)] | None = None  # the GPU's index on the node, if one


class NodeHealthReported(msgspec.Struct, frozen=True, tag="node_health_reported", kw_only=True):
    """Fact (health, for its reporter): a health report about a node that health validated (bounded size,
    schema, the reporter's scope covers the node). A ``fail`` one is followed by health's ``NodeDrained``
    with the report's reason (Slurm: State=DRAIN Reason=...).

    The same Struct is the wire format a reporter publishes on ``corral.ext.health.<reporter>.<node>``
    (``subjects.health_report_subject``), without ``reporter``: health fills it from the subject, which the
    NATS permissions bind to the reporter's connection.
    """

    node: NodeName  # the node the report is about (must be the subject's)
    source: HealthSource  # who measured it
    severity: HealthSeverity  # fail drains the node
    checks: Annotated[list[HealthCheck], msgspec.Meta(max_length=MAX_HEALTH_CHECKS)] = []  # the findings
    reporter: str = ""  # the service account or agent that reported it (from the subject, never the body)


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
    NodeHealthReported,
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
    | NodeHealthReported
)
