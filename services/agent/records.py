"""The agent's local record of the runs it launched: what makes a redelivered order a no-op.

An append-only JSON-lines file in the agent's state directory; each line is one fact
(``launched`` or ``exited``) about (job, attempt). It is read once at start.
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


class Records:
    """The record file of one node."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[tuple[int, int], Record] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            for line in path.read_bytes().splitlines():
                try:
                    rec = msgspec.json.decode(line, type=Record)
                except msgspec.DecodeError:
                    continue  # a torn last line after a crash
                self.runs[(rec.job_id, rec.attempt)] = rec

    def get(self, job_id: int, attempt: int) -> Record | None:
        """The record of a run, if any."""
        return self.runs.get((job_id, attempt))

    def latest_attempt(self, job_id: int) -> int:
        """The newest attempt of a job this node has seen (-1 if none)."""
        return max((a for (j, a) in self.runs if j == job_id), default=-1)

    def put(self, rec: Record) -> None:
        """Record a fact durably (fsync) before acting on it."""
        self.runs[(rec.job_id, rec.attempt)] = rec
        with open(self.path, "ab") as fh:
            fh.write(msgspec.json.encode(rec) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())

    def unfinished(self) -> list[Record]:
        """Runs that were launched and whose exit was never reported."""
        return [r for r in self.runs.values() if not r.exited]
