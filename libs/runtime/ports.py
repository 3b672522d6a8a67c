"""The ports the services' logic takes its time, its log and its calls through, and the log's records.

Each port has a real adapter and an in-memory fake beside it; one contract suite
(``tests/integration/test_ports_contract.py``) runs against both, so the fake cannot drift:

============  =====================================  =========================================
port          real adapter                           in-memory fake
============  =====================================  =========================================
``Clock``     ``clock.SystemClock``                  ``clock.FakeClock`` (moves when told)
``EventLog``  ``bus.Bus`` (JetStream)                ``memlog.MemLog``
``JobIds``    ``bus.Bus`` (a KV counter)             ``memlog.MemLog``
``ApiClient`` ``bus.NatsApi`` (NATS request/reply)   ``memlog.MemApi``
============  =====================================  =========================================

An entry is decoded the same way whatever stored it (``decode_entry``), so a malformed entry, or one whose
body claims another subject than its own, reads the same from either.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from corral.schemas import subjects
from corral.schemas.codec import DecodeError, decode_envelope
from corral.schemas.events import Envelope, Event


@dataclass(frozen=True)
class Appended:
    """Result of an append."""

    seq: int  # stream sequence of the entry (the original one for a duplicate)
    duplicate: bool  # the log had this message id already
    envelope: Envelope  # what was sent


@dataclass(frozen=True)
class LogEntry:
    """One entry of the log as a reader sees it."""

    seq: int  # stream sequence
    subject: str  # subject it was appended on
    envelope: Envelope | None  # decoded entry, None if it failed to decode
    error: str | None = None  # why it failed to decode
    pending: int = 0  # entries after this one that the reader has not seen yet
    data: bytes = b""  # the stored bytes of an entry that failed to decode (b"" for one that decoded)


class Clock(Protocol):
    """Wall time, monotonic time, and sleeping (``FakeClock`` makes all three exact in tests)."""

    def now(self) -> float:
        """Wall-clock time, seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """A clock that never goes back, for intervals and deadlines."""
        ...

    async def sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep ``seconds``, or less if ``wake`` is set first (at once if it is set already)."""
        ...


class EventLog(Protocol):
    """The event log: appends (idempotent, optionally conditional) and reads by sequence or subject."""

    async def append(
        self,
        body: Event,
        *,
        msg_id: str | None = None,
        expect_last_seq: int | None = None,
        expect_subject: str | None = None,
        occurred_at: float | None = None,
        correlation_id: str | None = None,
        causation_id: str | None = None,
        traceparent: str | None = None,
    ) -> Appended:
        """Append ``body`` on its subject. With ``expect_last_seq``, only if the newest entry on
        ``expect_subject`` (a wildcard; the body's own subject if None) has that sequence (0: none), else
        ``AppendConflict`` (checked first, a retry included). Then a ``msg_id`` seen before appends nothing
        and returns the original sequence (``duplicate``). ``TransientError`` if the log cannot be reached."""
        ...

    async def entry(self, seq: int) -> LogEntry:
        """The entry at ``seq``."""
        ...

    async def last_entry(self, subject: str) -> LogEntry | None:
        """The newest entry on ``subject`` (a wildcard is allowed), or None if there is none."""
        ...

    async def last_entries(self, wanted: Sequence[str]) -> dict[str, LogEntry]:
        """The newest entry of each subject of ``wanted`` that has one (no wildcards), by subject: what
        ``last_entry`` gives for each, in a few requests however many they are."""
        ...

    def read(
        self, from_seq: int = 1, subject: str = subjects.EVENTS_SUBJECTS, follow: bool = False
    ) -> AsyncIterator[LogEntry]:
        """Entries on ``subject`` in log order from ``from_seq``, each with how many are ``pending`` after
        it; ends once the entries that were there when it started are read, unless ``follow``."""
        ...

    def entries(
        self,
        subject_filters: Sequence[str],
        wanted: Callable[[str], bool] | None = None,
        slim: bool = False,
    ) -> AsyncIterator[LogEntry]:
        """Entries on any of ``subject_filters`` (wildcards allowed, no two overlapping) in log order, up to
        those that were there when it started: one job's, one node's history (``corral audit``). Those whose
        subject ``wanted`` refuses are skipped without being decoded; ``slim`` decodes submissions without
        their script and environment (``codec.decode_slim_envelope``)."""
        ...


class JobIds(Protocol):
    """The cluster's job id counter."""

    async def next_job_id(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive ids and return the first (ValueError if ``count`` < 1)."""
        ...

    async def last_job_id(self) -> int:
        """The highest id reserved so far (0 if none)."""
        ...


class ApiClient(Protocol):
    """Calls of another service's API verbs, as the service holding the client."""

    async def request(self, verb: str, data: bytes, timeout: float) -> bytes:
        """The reply to ``data`` sent to ``verb``; TimeoutError if nobody answers within ``timeout``
        (no server of that verb at all included)."""
        ...


def decode_entry(
    seq: int,
    subject: str,
    data: bytes,
    pending: int = 0,
    decode: Callable[[bytes], Envelope] = decode_envelope,
) -> LogEntry:
    """The entry stored as ``data`` on ``subject``: decoded (by ``decode``: the full decoder unless a reader
    says otherwise, ``codec.decode_slim_envelope``), or with the reason it is unreadable and its bytes."""
    try:
        env = decode(data)
    except DecodeError as exc:
        return LogEntry(seq=seq, subject=subject, envelope=None, error=str(exc), pending=pending, data=data)
    expected = misplaced(env, subject)
    if expected is not None:
        # A writer may only publish where its permissions allow: the subject is the authenticated
        # part, so a body that claims another job or node than its subject is rejected.
        return LogEntry(
            seq=seq,
            subject=subject,
            envelope=None,
            error=f"body belongs on {expected}",
            pending=pending,
            data=data,
        )
    return LogEntry(seq=seq, subject=subject, envelope=env, pending=pending)


def misplaced(env: Envelope, subject: str) -> str | None:
    """The subject ``env`` belongs on if that is not the log subject ``subject`` it was read from, or None."""
    if not subject.startswith("corral.evt."):
        return None
    expected = subjects.event_subject(env.body)
    return None if expected == subject else expected
