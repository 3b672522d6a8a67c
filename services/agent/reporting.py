"""What the agent tells the log about its node's runs: ``RunStarted`` and ``RunExited``, each appended
(retrying until the log takes it, deduplicated by a message id) before the run's record says it was
reported, so a restarted agent reports what its predecessor did not, and nothing twice. Each carries the
job's trace context from the run's record (an append span in the job's trace) and names the run's
``JobAllocated`` as its cause (the event id its order carried, kept in the run's record). Each report, once
in the log, counts in the agent's metrics (``metrics.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.libs.runtime.errors import TransientError
from corral.libs.runtime.ports import EventLog
from corral.schemas import events as ev
from corral.services.agent import runner
from corral.services.agent.metrics import AgentMetrics
from corral.services.agent.records import Record, Records


class Reporter:
    """Appends the node's facts to the log."""

    def __init__(
        self, events: EventLog, node: str, records: Records, log: Any, metrics: AgentMetrics | None = None
    ) -> None:
        self.events = events  # the log (the real Bus, or an in-memory one in unit tests)
        self.node = node  # this node's name
        self.records = records  # where a run's reports are recorded
        self.log = log
        self.metrics = metrics  # launches and exits by outcome (None: no metrics)

    async def append(
        self,
        body: ev.Event,
        msg_id: str | None = None,
        traceparent: str | None = None,
        cause: str | None = None,
    ) -> None:
        """Append an event (in the trace ``traceparent`` names, caused by the event id ``cause``), retrying
        (with backoff) while the log is unavailable."""
        delay = 0.2
        while True:
            try:
                await self.events.append(body, msg_id=msg_id, traceparent=traceparent, causation_id=cause)
                return
            except TransientError as exc:
                self.log.warning("append failed, retrying", error=str(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _traceparent(self, job_id: int, attempt: int) -> str | None:
        """The run's trace context, from its record (the order that started or killed it here)."""
        rec = self.records.get(job_id, attempt)
        return rec.traceparent if rec is not None else None

    async def report_start(self, run: runner.Run) -> None:
        """Append RunStarted (retrying until the log takes it), then record that it was reported."""
        job_id, attempt = run.key
        await self.append(
            ev.RunStarted(job_id=ev.JobId(job_id), attempt=attempt, node=ev.NodeName(self.node), pid=run.pid),
            msg_id=f"start:{job_id}:{attempt}:{self.node}",
            traceparent=self._traceparent(job_id, attempt),
            cause=self._cause(job_id, attempt),
        )
        self.records.note(job_id, attempt, start_reported=True)  # (lost with the machine: reported again)
        if self.metrics is not None:
            self.metrics.started()

    async def report_exit(
        self, job_id: int, attempt: int, outcome: runner.Outcome, launch_error: str | None = None
    ) -> None:
        """Append RunExited (retrying until the log takes it), then record that it was reported."""
        body = ev.RunExited(
            job_id=ev.JobId(job_id),
            attempt=attempt,
            node=ev.NodeName(self.node),
            exit_code=outcome.exit_code,
            signal=outcome.signal,
            killed=outcome.killed,
            timed_out=outcome.timed_out,
            launch_error=launch_error,
            oom=outcome.oom,
        )
        await self.append(
            body,
            msg_id=f"exit:{job_id}:{attempt}:{self.node}",
            traceparent=self._traceparent(job_id, attempt),
            cause=self._cause(job_id, attempt),
        )
        if self.records.get(job_id, attempt) is None:
            await self.records.record(Record(job_id=job_id, attempt=attempt))
        self.records.ended(job_id, attempt)
        if self.metrics is not None:
            self.metrics.exited(body)

    def _cause(self, job_id: int, attempt: int) -> str | None:
        """The run's allocation's event id, as its order gave it (None for a run known by no order)."""
        record = self.records.get(job_id, attempt)
        return record.cause_id or None if record is not None else None
