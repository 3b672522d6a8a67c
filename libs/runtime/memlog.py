"""``MemLog``: the event log and the job id counter in memory, the fake of ``Bus`` for fast tests.

It keeps what JetStream keeps for Corral: entries as encoded bytes with their subjects and sequences, the
message ids seen (a retry with one is a duplicate; there is no window, a test never outlives one), and a
counter of job ids. Appends check an expected last sequence over a wildcard subject as the server does, and
entries are decoded on reading with ``ports.decode_entry``, as ``Bus`` does. The contract suite
(``tests/integration/test_ports_contract.py``) holds it to the behaviour of ``Bus`` on a real nats-server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from corral.libs.runtime.errors import AppendConflict
from corral.libs.runtime.ports import Appended, LogEntry, decode_entry
from corral.schemas import subjects
from corral.schemas.codec import decode_envelope, decode_slim_envelope, encode, envelope
from corral.schemas.events import Event


@dataclass(frozen=True)
class _Stored:
    """One entry as the log keeps it."""

    seq: int  # its sequence, from 1
    subject: str  # the subject it was appended on
    data: bytes  # the encoded envelope (or whatever bytes were put there)


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` matches the NATS subject ``pattern`` (``*``: one token, ``>``: the rest)."""
    tokens = subject.split(".")
    wanted = pattern.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or token not in ("*", tokens[i]):
            return False
    return len(wanted) == len(tokens)


class MemLog:
    """The event log (``EventLog``) and the job id counter (``JobIds``) of one actor, in memory."""

    def __init__(self, actor: str = "tests") -> None:
        self.actor = actor  # who the appended envelopes say wrote them
        self._entries: list[_Stored] = []  # the log, entry n at index n - 1
        self._msg_ids: dict[str, int] = {}  # message id -> sequence of the entry it appended
        self._grown = asyncio.Event()  # set (and replaced) on every append: wakes following readers
        self._last_job_id = 0  # the job id counter

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
        """Append one event; AppendConflict if ``expect_last_seq`` is stale for ``expect_subject``."""
        env = envelope(
            body,
            actor=self.actor,
            occurred_at=occurred_at,
            correlation_id=correlation_id,
            causation_id=causation_id,
            traceparent=traceparent,
        )
        subject = subjects.event_subject(body)
        key = msg_id or env.meta.event_id
        # As on the server, the expectation is checked first: a retry with a stale one is a conflict.
        if expect_last_seq is not None:
            last = self._last(expect_subject or subject)
            if (last.seq if last is not None else 0) != expect_last_seq:
                raise AppendConflict(expect_subject or subject, expect_last_seq)
        if key in self._msg_ids:
            return Appended(seq=self._msg_ids[key], duplicate=True, envelope=env)
        seq = self.put(subject, encode(env))
        self._msg_ids[key] = seq
        return Appended(seq=seq, duplicate=False, envelope=env)

    def put(self, subject: str, data: bytes) -> int:
        """Store raw bytes on ``subject`` (as a raw publish does, malformed or not); its sequence."""
        seq = len(self._entries) + 1
        self._entries.append(_Stored(seq, subject, data))
        grown, self._grown = self._grown, asyncio.Event()
        grown.set()
        return seq

    async def entry(self, seq: int) -> LogEntry:
        """The entry at ``seq``; KeyError if there is none."""
        if not 1 <= seq <= len(self._entries):
            raise KeyError(f"no entry {seq}")
        stored = self._entries[seq - 1]
        return decode_entry(stored.seq, stored.subject, stored.data)

    async def last_entry(self, subject: str) -> LogEntry | None:
        """The newest entry on ``subject`` (a wildcard is allowed), or None."""
        stored = self._last(subject)
        return None if stored is None else decode_entry(stored.seq, stored.subject, stored.data)

    async def last_entries(self, wanted: Sequence[str]) -> dict[str, LogEntry]:
        """The newest entry of each subject of ``wanted`` that has one, by subject."""
        found = {subject: await self.last_entry(subject) for subject in wanted}
        return {subject: entry for subject, entry in found.items() if entry is not None}

    async def read(
        self, from_seq: int = 1, subject: str = subjects.EVENTS_SUBJECTS, follow: bool = False
    ) -> AsyncIterator[LogEntry]:
        """Entries on ``subject`` in log order from ``from_seq``; stops when caught up unless ``follow``."""
        end = len(self._entries)
        seq = max(from_seq, 1)
        while True:
            grown = self._grown  # taken before looking, so an append while yielding is not missed
            while seq <= len(self._entries):
                stored = self._entries[seq - 1]
                seq += 1
                if not follow and stored.seq > end:
                    return
                if subject_matches(subject, stored.subject):
                    pending = sum(subject_matches(subject, e.subject) for e in self._entries[stored.seq :])
                    yield decode_entry(stored.seq, stored.subject, stored.data, pending)
            if not follow:
                return
            await grown.wait()

    async def entries(
        self,
        subject_filters: Sequence[str],
        wanted: Callable[[str], bool] | None = None,
        slim: bool = False,
    ) -> AsyncIterator[LogEntry]:
        """Entries on any of ``subject_filters`` in log order, up to the newest when it started (``wanted``:
        only those whose subject it accepts; ``slim``: submissions without script and environment)."""
        decode = decode_slim_envelope if slim else decode_envelope
        for stored in self._entries[: len(self._entries)]:
            if any(subject_matches(f, stored.subject) for f in subject_filters) and (
                wanted is None or wanted(stored.subject)
            ):
                yield decode_entry(stored.seq, stored.subject, stored.data, decode=decode)

    def bodies(self, subject: str = subjects.EVENTS_SUBJECTS) -> list[Event | None]:
        """The bodies on ``subject`` in log order (None for an unreadable entry): for a test's assertions."""
        found = [decode_entry(s.seq, s.subject, s.data) for s in self._entries]
        return [e.envelope.body if e.envelope else None for e in found if subject_matches(subject, e.subject)]

    async def next_job_id(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive job ids; the first."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        first = self._last_job_id + 1
        self._last_job_id += count
        return first

    async def last_job_id(self) -> int:
        """The highest job id reserved so far (0 if none)."""
        return self._last_job_id

    def _last(self, subject: str) -> _Stored | None:
        return next((s for s in reversed(self._entries) if subject_matches(subject, s.subject)), None)
