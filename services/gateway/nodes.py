"""Admins' node drain, down and resume at the gateway (``scontrol update NodeName=LIST
State=DRAIN|DOWN|RESUME``).

Checks before anything is appended (pure: ``check_update``, ``resume_problem``): the caller is an admin
(Slurm: ``Access/permission denied``), every node is configured (``Invalid node name specified``), a
DRAIN or DOWN has a one-line reason (Slurm: ``You must specify a reason when DOWNING or DRAINING a node.
Request denied``), a DOWN names only registered nodes, and a RESUME names only drained or downed nodes
(``Invalid node state specified``). A request with one bad node appends nothing.

Then one intent per node (``NodeDrainRequested``/``NodeDownRequested``/``NodeResumeRequested`` on the
node's subjects), and a bounded wait for health's answer (``NodeDrained``/``NodeDown``/``NodeResumed``
after the intent on the same node): once
the reply says done, the drain is in the log ahead of any job submitted later, so the scheduler, which
folds the log in order, never starts such a job on the node. Without an answer in time the reply says
so; the intents stay and health answers them when it runs.

The gateway holds no state: whether a node is drained or downed is read from its newest ``NodeDrained``,
``NodeDown``, ``NodeResumed`` and ``NodeRegistered`` entries.
"""

from __future__ import annotations

from corral.libs.config.cluster import ClusterConfig
from corral.libs.runtime.errors import Forbidden, InvalidInput, TransientError
from corral.libs.runtime.ports import Clock, EventLog, LogEntry
from corral.schemas import api, subjects
from corral.schemas import events as ev

#: How long the gateway waits for health to answer each node's request.
ANSWER_TIMEOUT_S = 10.0
#: Pause between two looks at a node's answer subject.
_POLL_S = 0.05
#: Slurm's wording of each refusal.
DENIED = "Access/permission denied"
INVALID_NODE = "Invalid node name specified"
INVALID_STATE = "Invalid node state specified"
NEED_REASON = "You must specify a reason when DOWNING or DRAINING a node. Request denied"


def check_update(req: api.NodeUpdateRequest, config: ClusterConfig) -> None:
    """Raise InvalidInput naming the field if the request can never be carried out on this cluster."""
    if not req.nodes:
        raise InvalidInput(f"{INVALID_NODE}: give NodeName=LIST", field="NodeName")
    known = {n.name for n in config.nodes}
    unknown = [n for n in dict.fromkeys(req.nodes) if n not in known]
    if unknown:
        shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise InvalidInput(f"{INVALID_NODE}: {shown} (sinfo -N lists the nodes)", field="NodeName")
    if req.state in ("DRAIN", "DOWN"):
        reason = req.reason.strip()
        if not reason:
            raise InvalidInput(NEED_REASON, field="Reason")
        if len(reason) > ev.MAX_NODE_REASON or not reason.isprintable():
            raise InvalidInput(
                f"Reason= must be one line of at most {ev.MAX_NODE_REASON} printable characters",
                field="Reason",
            )


def resume_problem(
    node: str,
    drained: LogEntry | None,
    resumed: LogEntry | None,
    registered: LogEntry | None,
    downed: LogEntry | None = None,
) -> str | None:
    """Why ``node`` cannot be resumed (it is neither drained nor downed by an admin), from its newest
    drain, resume, registration and down entries; None if it may be."""
    after = resumed.seq if resumed is not None else 0
    if drained is not None and drained.seq > after:
        return None
    if downed is not None and downed.seq > after and _downed_by_admin(downed):
        return None
    # A registration drain (GPU count mismatch) since the last resume may be resumed too.
    body = registered.envelope.body if registered is not None and registered.envelope else None
    if isinstance(body, ev.NodeRegistered) and body.drain_reason and registered and registered.seq > after:
        return None
    return f"{INVALID_STATE}: {node} is not drained nor downed by an admin (RESUME ends a DRAIN or DOWN)"


class NodeUpdates:
    """The gateway's ``update_node`` verb."""

    def __init__(self, events: EventLog, config: ClusterConfig, admins: frozenset[str], clock: Clock) -> None:
        self.events = events
        self.config = config
        self.admins = admins
        self.clock = clock

    async def update(self, user: str, req: api.NodeUpdateRequest) -> api.NodeUpdateReply:
        """Drain, down or resume every node of the request (admins only), or none if one is refused."""
        if user not in self.admins:
            raise Forbidden(DENIED)
        check_update(req, self.config)
        nodes = list(dict.fromkeys(req.nodes))
        if req.state == "RESUME":
            for node in nodes:
                problem = resume_problem(
                    node,
                    await self._last(node, "node_drained"),
                    await self._last(node, "node_resumed"),
                    await self._last(node, "node_registered"),
                    await self._last(node, "node_down"),
                )
                if problem is not None:
                    raise InvalidInput(problem, field="State")
        if req.state == "DOWN":
            for node in nodes:
                if await self._last(node, "node_registered") is None:
                    raise InvalidInput(
                        f"{INVALID_STATE}: {node} has never registered (start its agent first)",
                        field="NodeName",
                    )
        appended: list[tuple[str, int]] = []
        for node in nodes:
            intent: ev.Event = ev.NodeResumeRequested(node=ev.NodeName(node), user=user)
            if req.state == "DRAIN":
                intent = ev.NodeDrainRequested(node=ev.NodeName(node), user=user, reason=req.reason.strip())
            elif req.state == "DOWN":
                intent = ev.NodeDownRequested(node=ev.NodeName(node), user=user, reason=req.reason.strip())
            appended.append((node, (await self.events.append(intent, correlation_id=node)).seq))
        answer = {"DRAIN": "node_drained", "DOWN": "node_down", "RESUME": "node_resumed"}[req.state]
        deadline = self.clock.monotonic() + ANSWER_TIMEOUT_S
        for node, seq in appended:
            await self._wait(node, answer, seq, deadline, by_admin=req.state == "DOWN")
        return api.NodeUpdateReply(nodes=nodes)

    async def _last(self, node: str, tag: str) -> LogEntry | None:
        return await self.events.last_entry(subjects.node_subject(node, tag))

    async def _wait(self, node: str, tag: str, after: int, deadline: float, by_admin: bool = False) -> None:
        """Until health's ``tag`` entry for ``node`` after sequence ``after`` is in the log; with ``by_admin``
        only an admin's ``NodeDown`` counts (health's own "Not responding" is not the answer to a DOWN)."""
        while True:
            entry = await self._last(node, tag)
            if entry is not None and entry.seq > after and (not by_admin or _downed_by_admin(entry)):
                return
            if self.clock.monotonic() >= deadline:
                raise TransientError(
                    f"health did not confirm node {node} in time; the request stays in the log and is "
                    "carried out when health runs (see sinfo -R)"
                )
            await self.clock.sleep(_POLL_S)


def _downed_by_admin(entry: LogEntry) -> bool:
    body = entry.envelope.body if entry.envelope is not None else None
    return isinstance(body, ev.NodeDown) and bool(body.by)
