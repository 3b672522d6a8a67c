"""The agent's metrics: its launches and its runs' exits, by outcome, counted as they are reported.

- ``corral_agent_launches_total{node,outcome}``: ``started`` (the script runs: ``RunStarted``) or ``failed``
  (it could not start, or the launch was refused: a ``RunExited`` with a launch error);
- ``corral_agent_run_exits_total{node,outcome}``: each ``RunExited`` by ``outcome_of``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from corral.schemas import events as ev


def outcome_of(exit: ev.RunExited) -> str:
    """How a run ended, the first that holds of: launch_failed, killed (by the agent, unasked), timeout,
    oom, signaled, failed (a non-zero exit) and completed."""
    if exit.launch_error:
        return "launch_failed"
    if exit.killed:
        return "killed"
    if exit.timed_out:
        return "timeout"
    if exit.oom:
        return "oom"
    if exit.signal:
        return "signaled"
    return "failed" if exit.exit_code else "completed"


class AgentMetrics:
    """The agent's families, on the process's registry."""

    def __init__(self, registry: CollectorRegistry, node: str) -> None:
        self.node = node
        self.launches = Counter(
            "corral_agent_launches", "Batch scripts launched", ["node", "outcome"], registry=registry
        )
        self.exits = Counter(
            "corral_agent_run_exits", "Runs' exits by outcome", ["node", "outcome"], registry=registry
        )

    def started(self) -> None:
        """A run's script started (its RunStarted is in the log)."""
        self.launches.labels(self.node, "started").inc()

    def exited(self, exit: ev.RunExited) -> None:
        """A run's RunExited is in the log."""
        if exit.launch_error:
            self.launches.labels(self.node, "failed").inc()
        self.exits.labels(self.node, outcome_of(exit)).inc()
