"""The agent's local record of the runs it launched: what makes a redelivered order a no-op.

An append-only JSON-lines file in the agent's state directory; each line is the whole record of one
(job, attempt) as of a fact (launch decided, supervisor started, warning signal sent, kill begun, exit
reported); the last line of a run wins. Each line is fsynced before the agent acts on it, and a torn last
line (a crash while writing) is skipped. It is read once at start: what the agent needs to re-adopt the
runs whose supervisors outlived it (see runner.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec


class Record(msgspec.Struct, kw_only=True):
    """What the agent knows of one run on its node."""

    job_id: int  # job
    attempt: int  # run
    pid: int = 0  # batch shell pid (0 if it never started)
    exited: bool = False  # its exit was reported
    supervisor: int = 0  # pid of the run's supervisor (0: not known yet)
    supervisor_start: int = 0  # the supervisor's start time in clock ticks since boot (guards pid reuse)
    started_at: float = 0.0  # Unix time the script started
    deadline: float | None = None  # Unix time of the run's time limit; None = unlimited
    warn_signal: int = 0  # --signal's number (0: none)
    warn_before_s: int = 0  # --signal's lead time before the deadline, seconds
    warn_batch_only: bool = False  # --signal=B:...: to the batch shell only
    warned: bool = False  # the --signal warning was delivered (once per run)
    ending: str = ""  # why the agent is killing it: "killed" (an order) or "timed_out"; "" = not killing
    # RunStarted is in the log: False from the launch until it is appended (an agent stopped in between
    # leaves it to its successor); True for records written before this field existed
    start_reported: bool = True
    traceparent: str | None = None  # the job's trace context, from its order: the run's facts carry it
    cause_id: str = ""  # event id of the run's JobAllocated (from its order): the cause of its facts


class Records:
    """The record file of one node."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[tuple[int, int], Record] = {}
        # job -> its newest attempt here: asked for every order, so not a scan of every run the node had
        self.latest: dict[int, int] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            for line in path.read_bytes().splitlines():
                try:
                    rec = msgspec.json.decode(line, type=Record)
                except msgspec.DecodeError:
                    continue  # a torn last line after a crash
                self._keep(rec)

    def get(self, job_id: int, attempt: int) -> Record | None:
        """The record of a run, if any."""
        return self.runs.get((job_id, attempt))

    def latest_attempt(self, job_id: int) -> int:
        """The newest attempt of a job this node has seen (-1 if none)."""
        return self.latest.get(job_id, -1)

    def put(self, rec: Record) -> None:
        """Record a fact durably (fsync) before acting on it."""
        self._keep(rec)
        with open(self.path, "ab") as fh:
            fh.write(msgspec.json.encode(rec) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def update(self, job_id: int, attempt: int, **changes: object) -> Record:
        """Record a change of a known run durably; returns the new record."""
        rec = msgspec.structs.replace(self.runs[(job_id, attempt)], **changes)
        self.put(rec)
        return rec

    def _keep(self, rec: Record) -> None:
        self.runs[(rec.job_id, rec.attempt)] = rec
        if rec.attempt > self.latest.get(rec.job_id, -1):
            self.latest[rec.job_id] = rec.attempt

    def unfinished(self) -> list[Record]:
        """Runs that were launched and whose exit was never reported."""
        return [r for r in self.runs.values() if not r.exited]
