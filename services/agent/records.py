"""The agent's local record of the runs it launched: what makes a redelivered order a no-op.

An append-only JSON-lines file in the agent's state directory; each line is the whole record of one
(job, attempt) as of a fact (launch decided, supervisor started, warning signal sent, kill begun, exit
reported); the last line of a run wins. A torn last line (a crash while writing) is skipped (and ended, so
the next line starts a line of its own). It is read once at start: what the agent needs to re-adopt the runs
whose supervisors outlived it (see runner.py).

Durability: a line is written (whole, to the file: it survives the agent's process) before the agent acts
on it. It is also fsynced first (it survives the machine) unless losing it with the machine only repeats a
step that is harmless twice; those lines (``note``) are made durable by the next fsync, not waited for:
- the supervisor started (its pid): a machine that went down took the supervisor with it, and a launched
  run without its supervisor's pid is adopted as one whose supervisor vanished, reported killed (its pids
  file, when the run's directory survived, still gives it);
- RunStarted and RunExited reported: a lost line reports them again, and the log drops the copy by its
  message id (``reporting.py``); an exit the log already has is not applied twice by the fold either.
Only the launch's own line is fsynced before it acts (a redelivered order finds it and does nothing), and
the rare facts decided in synchronous code (``put``, ``update``: a warning sent, a kill begun, an adoption).
A job's launch then costs one fsync, not four.

Group commit: ``record`` writes its line at once, in call order, and ``note``'s lines
come in between. While the disk answers an fsync in under ``INLINE_FSYNC_S`` they fsync in place;
when it is slower they wait for an fsync in a worker thread that covers every line written before it
started, and the lines written while one runs share the next, so the event loop goes on meanwhile (py-spy:
fsyncs in place held it for 13% of its time at ~50 launches a second a node). ``put`` and ``update`` fsync
in place, for the rare facts decided in synchronous code (a warning sent, a kill begun, an adoption).

Retention: a record may be forgotten once no copy of an order for its run can reach this agent any more.
- Copies come through the node's durable consumer of the work stream (``libs/runtime/streams.py``:
  ``work_consumer``, ``declare``). The stream keeps every order ``WORK_MAX_AGE_S`` after it stored it,
  delivered and acked or not; until then an unacked copy (an agent that died between acting and acking)
  comes again every ``ack_wait``, with no ``max_deliver``, and a consumer recreated under the node's name
  (deliver policy all) delivers the whole stream again. So a copy reaches the agent at most
  ``WORK_MAX_AGE_S`` after it was published, however often it was delivered.
- Copies are published by the leading scheduler, only while its folded state needs them
  (``libs/core/orders.py``: a launch while the run is its job's current attempt, RUNNING, with neither
  ``RunStarted`` nor ``RunExited`` folded; ``fold_runs.py`` sets ``run_started``/``run_exit``, and an
  attempt number is never current again once its job is requeued or ended). A new leader sends again what
  its state needs (``services/scheduler/sending.py``); a copy with the same message id within
  ``DUPLICATE_WINDOW_S`` of the first is dropped by the stream. So once a run's exit is in the log, a
  copy of its launch order, or of a launch of an earlier attempt of its job, comes only from a leader
  whose state trails its log by as much as the time since.
- Hence the rule: a record is kept while its run is unfinished (its exit not reported), and for
  ``RETENTION_S = WORK_MAX_AGE_S + LAG_MARGIN_S`` after its exit was reported (``exited_at``, the
  agent's wall clock; a record written before that field existed counts from the first compaction that
  sees it). Every copy published before the exit report + ``LAG_MARGIN_S`` is gone from the stream by
  then. The rule holds as long as no leading scheduler sends orders from a state more than
  ``LAG_MARGIN_S`` behind its log (it sends none from a state more than a minute behind:
  ``services/scheduler/app.py``, ``trails_log``), and the agent's clock is not that far ahead of the
  NATS server's (the stream ages messages on its clock). ``latest`` then knows only the kept runs: an
  order for an earlier attempt of a forgotten run's job was published while that attempt was current,
  before the forgotten run was allocated (a lagging leader aside, as above), so it is gone too.
  (A kill order is bounded the same way; one for a forgotten run would only be reported once more.)

Compaction: the file is rewritten as one line per kept record (``compact``) at start, once the start's
sweeps have read the records of the runs that ended (``work.py``: a directory left by a run forgotten now
goes first), and afterwards whenever it has grown to ``COMPACT_FACTOR`` lines per kept record (at least
``COMPACT_MIN_LINES``), so a long-running agent's file and memory stay the size of the runs inside the
retention. The new file is written under a temporary name in the same directory and fsynced, renamed over
the old one, and the directory fsynced: a crash at any point leaves the old file or the new one whole, and
the next start removes a temporary file left behind.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.ports import Clock
from corral.libs.runtime.streams import WORK_MAX_AGE_S

#: An fsync this quick is done in place by ``record``: a worker thread's handoff costs ~70 us of CPU (on this
#: project's 2-core VM, fsync ~70 us: 121 us of CPU a record through the thread, 49 in place), more than the
#: event loop loses waiting. A slower one (a busy or remote disk) moves the fsyncs to the thread, grouped.
INLINE_FSYNC_S = 0.0005
#: How far behind its log a leading scheduler's state may be, and the agent's clock ahead of the NATS
#: server's, for a forgotten run's order never to come (see Retention above).
LAG_MARGIN_S = 24 * 3600.0
#: How long a run's record is kept after its exit was reported: longer than any copy of its orders lives.
RETENTION_S = WORK_MAX_AGE_S + LAG_MARGIN_S
#: The file is compacted when it has this many lines per kept record (a run writes about four) ...
COMPACT_FACTOR = 4
#: ... and at least this many: a small file is not rewritten every few runs.
COMPACT_MIN_LINES = 10_000


class Record(msgspec.Struct, kw_only=True):
    """What the agent knows of one run on its node."""

    job_id: int  # job
    attempt: int  # run
    pid: int = 0  # batch shell pid (0 if it never started)
    exited: bool = False  # its exit was reported
    exited_at: float = 0.0  # Unix time its exit was reported (0: not reported, or before this field existed)
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

    def __init__(
        self,
        path: Path,
        clock: Clock | None = None,
        retention_s: float = RETENTION_S,
        compact_min_lines: int = COMPACT_MIN_LINES,
        crash: Callable[[str], None] | None = None,
    ) -> None:
        self.path = path
        self.clock = clock or SystemClock()  # when exits are reported, and when their retention is over
        self.retention_s = retention_s  # how long a run's record is kept after its exit was reported
        self.compact_min_lines = compact_min_lines  # the fewest lines the file is compacted at
        self.crash = crash  # the compaction's crash points (failure tests: crashpoints.py)
        self.runs: dict[tuple[int, int], Record] = {}
        # job -> its newest attempt here: asked for every order, so not a scan of every run the node had
        self.latest: dict[int, int] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        # A compaction cut short before its rename: the file in place is whole, the temporary one may not be.
        self._tmp = path.with_name(path.name + ".tmp")
        self._tmp.unlink(missing_ok=True)
        data = path.read_bytes() if path.exists() else b""
        self._lines = 0  # lines in the file
        for line in data.splitlines():
            self._lines += 1
            try:
                rec = msgspec.json.decode(line, type=Record)
            except msgspec.DecodeError:
                continue  # a torn last line after a crash
            self._keep(rec)
        self._fd = _open_append(path)
        if data and not data.endswith(b"\n"):
            os.write(self._fd, b"\n")  # ends the torn line: the next record is a line of its own
        self._written = 0  # lines written by this process
        self._durable = 0  # of those, the ones an fsync has covered
        self._syncing: asyncio.Future[None] | None = None  # the fsync running, if any
        self._quick = True  # the last fsync took less than INLINE_FSYNC_S
        # the file's length that makes a write compact it: none before the start's compaction (``compact``)
        self._compact_at = math.inf

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
            if self._compacted():
                return
            if self._syncing is None:
                self._syncing = asyncio.ensure_future(self._sync())
            await asyncio.shield(self._syncing)

    def note(self, job_id: int, attempt: int, **changes: object) -> Record:
        """Record a change of a known run whose loss with the machine only repeats a harmless step (see
        Durability above): written now, fsynced with the next line that is; returns the new record."""
        rec = msgspec.structs.replace(self.runs[(job_id, attempt)], **changes)
        self._write(rec)
        self._compacted()  # (when one is due: it fsyncs the new file, this line in it)
        return rec

    def ended(self, job_id: int, attempt: int) -> Record:
        """Note that the run's exit was reported, now (its retention starts)."""
        return self.note(job_id, attempt, exited=True, exited_at=self.clock.now())

    def _write(self, rec: Record) -> int:
        """Keep ``rec`` and append its line (one write: appends do not interleave); the line's number."""
        self._keep(rec)
        _write_all(self._fd, msgspec.json.encode(rec) + b"\n")
        self._written += 1
        self._lines += 1
        return self._written

    def _fsync(self, upto: int) -> None:
        """An fsync in place, covering the lines up to ``upto`` (a compaction's, when one is due)."""
        if self._compacted():
            return
        self._quick = timed_fsync(self._fd) < INLINE_FSYNC_S
        self._durable = max(self._durable, upto)

    def _compacted(self) -> bool:
        """Compact the file, if it has grown to ``COMPACT_FACTOR`` lines per record and no fsync of it runs in
        the worker thread, in place of the fsync due now (it makes every line durable); whether it did."""
        if self._lines < self._compact_at or self._syncing is not None:
            return False
        try:
            self.compact()
        except OSError:
            return False  # (a full disk: the lines are written, and fsynced now as they would have been)
        return True

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

    def compact(self) -> int:
        """Forget the runs whose exit was reported ``retention_s`` ago or more, and rewrite the file as one
        line per record kept (see Compaction above); the number of runs forgotten. Every line written before
        is durable after."""
        now = self.clock.now()
        kept: dict[tuple[int, int], Record] = {}
        for key, rec in self.runs.items():
            if rec.exited and not rec.exited_at:
                rec = msgspec.structs.replace(rec, exited_at=now)  # reported at an unknown time: from now
            if not (rec.exited and now - rec.exited_at >= self.retention_s):
                kept[key] = rec
        fd = _open_append(self._tmp, truncate=True)
        try:
            _write_all(fd, b"".join(msgspec.json.encode(rec) + b"\n" for rec in kept.values()))
            os.fsync(fd)
            self._crash("records.compact_written")
            os.replace(self._tmp, self.path)
        except BaseException:
            os.close(fd)
            self._tmp.unlink(missing_ok=True)
            # the old file stays, whole; it is tried again once it has grown as much
            self._compact_at = self._lines + self._threshold()
            raise
        # From here on the records are the new file's, whatever happens next.
        old, self._fd = self._fd, fd
        os.close(old)
        forgotten = len(self.runs) - len(kept)
        self.runs, self.latest = {}, {}
        for rec in kept.values():
            self._keep(rec)
        self._lines = len(kept)
        self._durable = self._written
        self._compact_at = self._threshold()
        self._crash("records.compact_renamed")
        _fsync_dir(self.path.parent)
        return forgotten

    def _threshold(self) -> int:
        """The lines the file may have before it is compacted again."""
        return max(self.compact_min_lines, COMPACT_FACTOR * len(self.runs))

    def _crash(self, point: str) -> None:
        if self.crash is not None:
            self.crash(point)


def _open_append(path: Path, truncate: bool = False) -> int:
    """A file opened for appends (created 0600; emptied first if ``truncate``)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
    return os.open(path, flags, 0o600)


def _write_all(fd: int, data: bytes) -> None:
    """Write ``data`` whole: a short write (a full disk) is finished or raises: no torn line is acted on."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    """fsync a directory: a rename in it is durable after."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def timed_fsync(fd: int) -> float:
    """fsync ``fd``; the seconds it took."""
    started = time.perf_counter()
    os.fsync(fd)
    return time.perf_counter() - started
