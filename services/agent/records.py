"""The agent's local record of the runs it launched: what makes a redelivered order a no-op.

An append-only JSON-lines file in the agent's state directory; each line is the whole record of one
(job, attempt) as of a fact (launch decided, supervisor started, warning signal sent, kill begun, exit
reported); the last line of a run wins. Each line is fsynced before the agent acts on it, and a torn last
line (a crash while writing) is skipped (and ended, so the next line starts a line of its own). It is read
once at start: what the agent needs to re-adopt the runs whose supervisors outlived it (see runner.py).

Group commit: ``record`` and ``change``, the launch's and the reports' (four lines a job), write their line
at once, in call order. While the disk answers an fsync in under ``INLINE_FSYNC_S`` they fsync in place;
when it is slower they wait for an fsync in a worker thread that covers every line written before it
started, and the lines written while one runs share the next, so the event loop goes on meanwhile (py-spy:
fsyncs in place held it for 13% of its time at ~50 launches a second a node). ``put`` and ``update`` fsync
in place, for the rare facts decided in synchronous code (a warning sent, a kill begun, an adoption).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import msgspec

#: An fsync this quick is done in place by ``record``: a worker thread's handoff costs ~70 us of CPU (on this
#: project's 2-core VM, fsync ~70 us: 121 us of CPU a record through the thread, 49 in place), more than the
#: event loop loses waiting. A slower one (a busy or remote disk) moves the fsyncs to the thread, grouped.
INLINE_FSYNC_S = 0.0005


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


def run_key(name: str) -> tuple[int, int] | None:
    """The (job, attempt) of a run's directory name, ``<job>.<attempt>``; None for any other name."""
    job_text, _, attempt_text = name.partition(".")
    if not (job_text.isdigit() and attempt_text.isdigit()):
        return None
    return int(job_text), int(attempt_text)


class Records:
    """The record file of one node."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs: dict[tuple[int, int], Record] = {}
        # job -> its newest attempt here: asked for every order, so not a scan of every run the node had
        self.latest: dict[int, int] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes() if path.exists() else b""
        for line in data.splitlines():
            try:
                rec = msgspec.json.decode(line, type=Record)
            except msgspec.DecodeError:
                continue  # a torn last line after a crash
            self._keep(rec)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if data and not data.endswith(b"\n"):
            os.write(self._fd, b"\n")  # ends the torn line: the next record is a line of its own
        self._written = 0  # lines written by this process
        self._durable = 0  # of those, the ones an fsync has covered
        self._syncing: asyncio.Future[None] | None = None  # the fsync running, if any
        self._quick = True  # the last fsync took less than INLINE_FSYNC_S

    def get(self, job_id: int, attempt: int) -> Record | None:
        """The record of a run, if any."""
        return self.runs.get((job_id, attempt))

    def latest_attempt(self, job_id: int) -> int:
        """The newest attempt of a job this node has seen (-1 if none)."""
        return self.latest.get(job_id, -1)

    def put(self, rec: Record) -> None:
        """Record a fact durably (fsync, in place) before acting on it."""
        self._fsync(self._write(rec))

    def update(self, job_id: int, attempt: int, **changes: object) -> Record:
        """Record a change of a known run durably (fsync, in place); returns the new record."""
        rec = msgspec.structs.replace(self.runs[(job_id, attempt)], **changes)
        self.put(rec)
        return rec

    async def record(self, rec: Record) -> None:
        """Record a fact durably before acting on it: written now, fsynced with the lines written near it."""
        line = self._write(rec)
        if self._quick and self._syncing is None:
            self._fsync(line)
            return
        while self._durable < line:
            if self._syncing is None:
                self._syncing = asyncio.ensure_future(self._sync())
            await asyncio.shield(self._syncing)

    async def change(self, job_id: int, attempt: int, **changes: object) -> Record:
        """``update``, group-committed as ``record``; returns the new record."""
        rec = msgspec.structs.replace(self.runs[(job_id, attempt)], **changes)
        await self.record(rec)
        return rec

    def _write(self, rec: Record) -> int:
        """Keep ``rec`` and append its line (one write: appends do not interleave); the line's number."""
        self._keep(rec)
        line = memoryview(msgspec.json.encode(rec) + b"\n")
        while line:  # a short write (a full disk) is finished or raises: a torn line is never acted on
            line = line[os.write(self._fd, line) :]
        self._written += 1
        return self._written

    def _fsync(self, upto: int) -> None:
        """An fsync in place, covering the lines up to ``upto``."""
        self._quick = timed_fsync(self._fd) < INLINE_FSYNC_S
        self._durable = max(self._durable, upto)

    async def _sync(self) -> None:
        """One fsync, in a worker thread, covering every line written before it started."""
        upto = self._written
        try:
            # timed in the thread: the handoff's own time does not count as the disk's
            self._quick = await asyncio.to_thread(timed_fsync, self._fd) < INLINE_FSYNC_S
            self._durable = max(self._durable, upto)
        finally:
            self._syncing = None

    def _keep(self, rec: Record) -> None:
        self.runs[(rec.job_id, rec.attempt)] = rec
        if rec.attempt > self.latest.get(rec.job_id, -1):
            self.latest[rec.job_id] = rec.attempt

    def unfinished(self) -> list[Record]:
        """Runs that were launched and whose exit was never reported."""
        return [r for r in self.runs.values() if not r.exited]


def timed_fsync(fd: int) -> float:
    """fsync ``fd``; the seconds it took."""
    started = time.perf_counter()
    os.fsync(fd)
    return time.perf_counter() - started
