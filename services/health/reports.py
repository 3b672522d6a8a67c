"""Health reports from outside the log (a DCGM-style exporter, an agent's health-check program) into drains.

Cycle of one report, received on ``corral.ext.health.<reporter>.<node>`` (a queue group: one health replica
takes each):
1. accept it (``libs/core/node_health.accept``: bounded size, the schema, the reporter's scope covers the
   node); a refused one is dead-lettered on ``corral.dlq.health`` with its reason and counted, and changes
   nothing;
2. decide (``node_health.drain_for``): a failing report about a node not already drained for the same
   reason calls for a drain; any other report is only logged;
3. append the report (``NodeHealthReported``, actor health, ``reporter`` in the body) and then the drain
   (``NodeDrained``, by the reporter, ``requeue`` under ``health_failure_action = "requeue"``, its cause the
   report), each conditional on the node's last sequence as every node fact of health is; a lost race is
   dropped (the reporter reports again at its next interval, and the next report sees the newer state).
"""

from __future__ import annotations

from corral.libs.config.cluster import ClusterConfig
from corral.libs.core import node_health
from corral.libs.runtime import telemetry
from corral.libs.runtime.errors import AppendConflict, TransientError
from corral.libs.runtime.ports import EventLog
from corral.schemas import subjects


class HealthReports:
    """Turns accepted failing health reports into drains; dead-letters the others."""

    def __init__(
        self,
        events: EventLog,
        config: ClusterConfig,
        node_seq: dict[str, int],
        drained: dict[str, str],
    ) -> None:
        self.events = events
        self.accounts = config.service_accounts
        self.action = config.health_failure_action
        self.node_seq = node_seq  # health's view of each node's last log sequence (``Health.follow``)
        self.drained = drained  # health's view of each drained node's reason (``Health.follow``)
        self.log = telemetry.logger()

    async def handle(self, subject: str, data: bytes) -> str | None:
        """Accept, decide and append one report; the reason it is refused (to dead-letter), or None."""
        try:
            reporter, node = subjects.health_report_of(subject)
        except ValueError as exc:
            return str(exc)
        report = node_health.accept(data, reporter, node, self.accounts)
        if isinstance(report, str):
            self.log.warning("health report refused", subject=subject, reason=report)
            return report
        drain = node_health.drain_for(report, self.action, self.drained.get(node))
        if drain is None:
            self.log.info("health report", node=node, reporter=reporter, severity=report.severity)
            return None
        wildcard = subjects.node_events(node)
        try:
            recorded = await self.events.append(
                report, expect_last_seq=self.node_seq.get(node, 0), expect_subject=wildcard
            )
            await self.events.append(
                drain,
                expect_last_seq=recorded.seq,
                expect_subject=wildcard,
                causation_id=recorded.envelope.meta.event_id,
            )
            self.drained[node] = drain.reason  # until the log says otherwise: no second drain meanwhile
            self.log.warning(
                "node drained by a health report", node=node, reporter=reporter, reason=drain.reason
            )
        except AppendConflict:
            self.log.info("health report lost a race; the next report decides again", node=node)
        except TransientError as exc:
            self.log.warning("cannot record a health report", node=node, error=str(exc))
        return None
