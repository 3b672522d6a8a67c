"""The fold's node events (``fold.py`` dispatches them here): registrations, liveness, admin drains and downs.

A node's GPUs, CPUs and memory in use are the fold's (allocations and orphans); these handlers keep its
inventory, whether it is up, and why it is drained or down. An admin's drain or down (``AdminDrain``)
outlives re-registrations; only ``NodeResumed`` ends either.

A ``NodeDrained`` with ``requeue`` (health's drain for a failing health report under
``health_failure_action = "requeue"``) also asks for the requeue of each running job on the node that may be
requeued, as ``scontrol requeue`` does (``mark_requeue``, the one rule for both): the plan has the run killed
and concludes ``JobRequeued(reason="Requested")``. A ``--no-requeue`` job is left to finish.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from corral.libs.core.outcome import APPLIED, Outcome, ignored
from corral.libs.core.state import AdminDrain, Job, Node, Orphan, State
from corral.schemas import events as ev

#: An allocation's node (in C).
_node_of = attrgetter("node")


def runs_on(job: Job, node: str) -> bool:
    """Whether ``job``'s run is allocated ``node`` (a scan in C: each node of a wide run reports its exit)."""
    return node in map(_node_of, job.allocations)


def drop_orphans(state: State, gone: Callable[[Orphan], bool]) -> None:
    """Forget orphans that ended, giving their resources back to their node."""
    keep = []
    for orphan in state.orphans:
        if not gone(orphan):
            keep.append(orphan)
            continue
        node = state.nodes.get(orphan.node)
        if node is not None:
            held = set(orphan.gpus)
            node.used_gpus = [g for g in node.used_gpus if g not in held]
            node.alloc_cpus -= orphan.cpus
            node.alloc_mem_mb -= orphan.mem_mb
    state.orphans = keep


def _node_registered(state: State, seq: int, at: float, body: ev.NodeRegistered) -> Outcome:
    node = state.nodes.get(body.node)
    if node is None:
        state.nodes[body.node] = Node(
            name=body.node,
            cpus=body.cpus,
            mem_mb=body.mem_mb,
            gpus=body.gpus,
            gpu_type=body.gpu_type,
            partitions=list(body.partitions),
            features=list(body.features),
            drain=body.drain_reason,
            admin_drain=state.early_drains.pop(body.node, None),
        )
        return APPLIED
    node.cpus, node.mem_mb, node.gpus, node.gpu_type = body.cpus, body.mem_mb, body.gpus, body.gpu_type
    node.partitions, node.features = list(body.partitions), list(body.features)
    if node.admin_down is None:  # an admin's down outlives agent restarts, like an admin drain
        node.up, node.reason = True, ""
    # Only the registration's own drain follows the registration: an admin drain outlives agent restarts.
    node.drain = body.drain_reason
    return APPLIED


def _node_down(state: State, seq: int, at: float, body: ev.NodeDown) -> Outcome:
    node = state.nodes.get(body.node)
    if node is None:
        return ignored("unknown_node")
    node.up, node.reason = False, body.reason
    if body.by:
        # An admin's down: the agent still runs, so the node's runs become orphans to kill through it.
        node.admin_down = AdminDrain(reason=body.reason, by=body.by, at=at)
        return APPLIED
    node.admin_down = None
    # Its orphans stay: a node is down when its agent is silent, and an agent that died leaves its jobs'
    # processes running. Nothing is placed on a down node; once its agent is back, it kills them (its kill
    # orders wait in its work queue) and reports them gone.
    return APPLIED


def _node_up(state: State, seq: int, at: float, body: ev.NodeUp) -> Outcome:
    node = state.nodes.get(body.node)
    if node is None:
        return ignored("unknown_node")
    # Only a resume ends an admin's down, whatever the node's heartbeats say.
    if node.admin_down is not None:
        return ignored("wrong_state")
    node.up, node.reason = True, ""
    return APPLIED


def live_run(job: Job | None) -> Outcome | None:
    """Why ``job`` has no live run that is not ending already (cancelled, preempted, exited), or None."""
    if job is None:
        return ignored("unknown_job")
    if job.state != "RUNNING":
        return ignored("wrong_state")
    if job.run_exit is not None:
        return ignored("duplicate")
    return None


def mark_requeue(job: Job | None, by: str, hold: bool = False) -> Outcome:
    """Ask for the requeue of ``job``'s current run (``scontrol requeue``, or a health drain's requeue):
    only a live run that is not ending already; a cancelled, preempted or exited run is concluded as it is."""
    problem = live_run(job)
    if problem is not None:
        return problem
    assert job is not None
    if job.cancel_by is not None:
        return ignored("cancel_requested")
    if job.preempting is not None or job.requeue_by is not None:
        return ignored("duplicate")
    job.requeue_by, job.requeue_hold = by, hold
    return APPLIED


def _node_drained(state: State, seq: int, at: float, body: ev.NodeDrained) -> Outcome:
    drain = AdminDrain(reason=body.reason, by=body.by, at=at)
    node = state.nodes.get(body.node)
    if node is None:
        # Drained before its agent ever registered: the drain waits for the registration.
        state.early_drains[body.node] = drain
        return APPLIED
    node.admin_drain = drain
    if body.requeue:
        for job_id in state.active:
            job = state.jobs[job_id]
            if job.spec.requeue and runs_on(job, body.node):
                mark_requeue(job, body.by)  # one that is ending already is concluded as it is
    return APPLIED


def _node_resumed(state: State, seq: int, at: float, body: ev.NodeResumed) -> Outcome:
    early = state.early_drains.pop(body.node, None)
    node = state.nodes.get(body.node)
    if node is None:
        return APPLIED if early is not None else ignored("unknown_node")
    # Both drains end, as Slurm's RESUME does; a GPU mismatch drains again at the next registration.
    node.admin_drain, node.drain = None, ""
    if node.admin_down is not None:
        # RESUME of an admin's down: up again (health reports it down if it does not heartbeat).
        node.admin_down, node.up, node.reason = None, True, ""
    return APPLIED


NODE_HANDLERS: dict[type, Callable[[State, int, float, Any], Outcome]] = {
    ev.NodeRegistered: _node_registered,
    ev.NodeDown: _node_down,
    ev.NodeUp: _node_up,
    ev.NodeDrained: _node_drained,
    ev.NodeResumed: _node_resumed,
}
