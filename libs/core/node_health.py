"""Health reports about nodes (a DCGM-style exporter's XID and ECC errors, the agent's health-check program):
how one is accepted, and what a failing one calls for. Pure; health (``services/health/reports.py``) is the
shell that receives reports, appends what this returns and dead-letters what it refuses.

1. ``accept``: a report is at most ``MAX_REPORT_BYTES``, decodes as ``NodeHealthReported`` (bounded lists and
   strings), is about the node its subject names, and its reporter (the subject's, bound to the connection)
   may report that node (``scopes.report_problem``). Anything else is refused with the reason.
2. ``drain_for``: a ``fail`` report drains the node with a one-line reason made from its checks (Slurm:
   State=DRAIN Reason=...), by the reporter; under ``health_failure_action = "requeue"`` the drain also
   requeues the node's requeueable jobs (``NodeDrained.requeue``, applied by the fold), under ``"drain"``
   they finish. A node already drained for the same reason is not drained again (an exporter repeats its
   report every interval). ``ok`` and ``warning`` reports drain nothing and never resume a node: as in
   Slurm, an admin resumes a node a health check drained.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.libs.core.scopes import ServiceAccount, report_problem
from corral.schemas import events as ev

#: What a failing report does to the jobs running on its node (``[cluster] health_failure_action``).
FailureAction = Literal["requeue", "drain"]
FAILURE_ACTIONS: tuple[FailureAction, ...] = ("requeue", "drain")
#: The largest report accepted, in bytes (64 checks of 512-character messages fit).
MAX_REPORT_BYTES = 64 * 1024

_decoder = msgspec.json.Decoder(ev.NodeHealthReported)


def accept(
    data: bytes, reporter: str, node: str, accounts: tuple[ServiceAccount, ...]
) -> ev.NodeHealthReported | str:
    """The validated report published on ``corral.ext.health.<reporter>.<node>``, or why it is refused."""
    if len(data) > MAX_REPORT_BYTES:
        return f"report of {len(data)} bytes is larger than {MAX_REPORT_BYTES}"
    problem = report_problem(reporter, node, accounts)
    if problem is not None:
        return problem
    try:
        report = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        return f"not a node health report: {exc}"
    if report.node != node:
        return f"report is about node {report.node!r} but was published for node {node!r}"
    # The reporter is the subject's (the connection's), never what the body claims.
    return msgspec.structs.replace(report, reporter=reporter)


def drain_reason(report: ev.NodeHealthReported) -> str:
    """A failing report's checks as one line of at most ``MAX_NODE_REASON`` characters, e.g.
    ``dcgm: xid 79 gpu 3: GPU has fallen off the bus; ecc 2 gpu 1``."""
    parts = []
    for check in report.checks or [ev.HealthCheck(kind="other", message="failed")]:
        # The kind is left out where the source says it already (``healthcheck: exit 1: ...``).
        words = ([check.kind] if check.kind != report.source else []) + ([check.code] if check.code else [])
        if check.gpu is not None:
            words.append(f"gpu {check.gpu}")
        text = " ".join(words)
        if check.message:
            parts.append(f"{text}: {check.message}" if text else check.message)
        else:
            parts.append(text or check.kind)
    line = " ".join(f"{report.source}: {'; '.join(parts)}".split())  # one line: no newlines or tabs
    if len(line) > ev.MAX_NODE_REASON:
        line = line[: ev.MAX_NODE_REASON - 3] + "..."
    return line


def drain_for(
    report: ev.NodeHealthReported, action: FailureAction, drained: str | None
) -> ev.NodeDrained | None:
    """The drain a report calls for, given the node's current drain reason (None: not drained)."""
    if report.severity != "fail":
        return None
    reason = drain_reason(report)
    if drained == reason:
        return None
    return ev.NodeDrained(node=report.node, reason=reason, by=report.reporter, requeue=action == "requeue")
