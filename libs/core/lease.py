"""Scheduler leadership: the rules of the lease, pure functions of (now, what the lease key holds, who I am).

The lease is one JetStream KV key (``subjects.LEADER_BUCKET`` / ``LEASE_KEY``); its value is a ``Lease`` and
every write of it changes its revision, and every write is a compare-and-set on the revision read before
(two schedulers can never both win one revision). The shell (``services/scheduler/leadership.py``) reads the
key every ``poll_s(ttl)``, asks ``next_step`` what to do, and does it.

- **Leading.** The holder renews (rewrites its lease, same epoch) every ``ttl / 3``. It counts itself
  leader only until ``ttl`` after it *sent* its last successful renewal (``leading``), by its own monotonic
  clock: a process paused (SIGSTOP) past that moment stops deciding as soon as it runs again, before it
  learns anything from the server.
- **Lapse.** A standby cannot read the holder's clock, so it times the lease by its own: a revision it has
  seen unchanged for the lease's ``ttl_s`` (from when it first saw that revision, which is after the holder
  sent it) has lapsed. So a standby takes over only after the holder's own ``leading`` ended: no two
  leaders at once while clocks run at the same rate, whatever their offset.
- **Takeover.** The lapsed (or released, or missing) lease is replaced by the standby's, with the epoch
  bumped: one more than the newest epoch it knows, from the key or from the log (``State.epoch``), so a
  recreated bucket cannot hand out an epoch again. The epoch stamps every decision of the new leader, and
  every fold ignores decisions of an older one (``fold.apply``).
- **Release.** A leader that stops cleanly marks its lease released: a standby takes it at its next poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

#: How long a lease lasts without a renewal by default (``[scheduler] lease_ttl``): a standby decides within
#: about ``DEFAULT_TTL_S + poll_s`` of the leader's death, well inside the 5 s failover target.
DEFAULT_TTL_S = 3.0


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """The value of the lease key."""

    holder: str  # the holding scheduler's name (``--name``: its host by default)
    token: str  # the holding process's random id (two processes of one name are two holders)
    epoch: int  # the leader epoch: one more on every takeover, carried by every decision
    ttl_s: float  # seconds the lease lasts without a renewal
    released: bool = False  # the holder stepped down cleanly: a standby may take it at once


class Member(msgspec.Struct, frozen=True, kw_only=True):
    """A scheduler process's presence (``member.<name>`` in the leader bucket), for ``scontrol ping``."""

    name: str  # the scheduler's name
    token: str  # its process's random id
    beat_at: float  # wall-clock time of its latest beat (Unix seconds)
    ttl_s: float  # its lease TTL: it beats every ``ttl_s / 3``


@dataclass(frozen=True)
class Seen:
    """The lease key as one process last read it."""

    revision: int  # the key's revision (0: no key)
    lease: Lease | None  # its value (None: no key, or a value that does not decode)
    since: float  # the reader's monotonic time when it first saw this revision


@dataclass(frozen=True)
class Step:
    """What to do now: ``take`` the lease (a CAS on ``Seen.revision``; 0: create), ``renew`` it, ``wait``."""

    action: Literal["take", "renew", "wait"]
    epoch: int = 0  # the epoch of the lease to write (take, renew)


def poll_s(ttl_s: float) -> float:
    """Seconds between two reads of the lease key (by leader and standbys alike)."""
    return min(0.25, ttl_s / 12)


def op_timeout_s(ttl_s: float) -> float:
    """Seconds a read or write of a lease key may take before it is given up (and tried at the next poll): a
    third of the lease, so that a request lost with a NATS server (its reply never comes) is sent again while
    the lease still holds, not after the connection's default of 10 s, when it lapsed long ago."""
    return ttl_s / 3


def leading(now: float, renewed_at: float | None, ttl_s: float) -> bool:
    """True while a holder may decide: less than ``ttl_s`` after it sent its last successful write."""
    return renewed_at is not None and now < renewed_at + ttl_s


def seen(previous: Seen | None, revision: int, lease: Lease | None, now: float) -> Seen:
    """What a read of the key at ``now`` makes known: the revision's first sighting is kept."""
    if previous is not None and previous.revision == revision:
        return Seen(revision=revision, lease=lease, since=previous.since)
    return Seen(revision=revision, lease=lease, since=now)


def next_step(
    now: float, key: Seen, token: str, renewed_at: float | None, ttl_s: float, floor_epoch: int
) -> Step:
    """The lease rule for the process ``token`` (``module docstring``). ``renewed_at``: when it sent its last
    successful write of the lease (None: never, or lost); ``floor_epoch``: the newest epoch its fold saw."""
    lease = key.lease
    bump = max(floor_epoch, lease.epoch if lease is not None else 0) + 1
    if lease is None or lease.released:
        return Step("take", bump)
    if lease.token == token:
        # Mine: renew on time. Also after a pause past the lease: the CAS succeeds only if nobody took
        # it meanwhile, and then nobody else led.
        if renewed_at is None or now - renewed_at >= ttl_s / 3:
            return Step("renew", lease.epoch)
        return Step("wait")
    if now - key.since >= lease.ttl_s:
        return Step("take", bump)
    return Step("wait")


def roster(now: float, lease: Lease | None, members: list[Member]) -> list[tuple[str, str, bool]]:
    """``scontrol ping``'s lines as (name, role, up): the lease holder first as ``primary`` (up while its
    lease is held: not released and beaten recently), then every other scheduler as ``backup`` (``backupN``
    when there are several), by name; a member is up if its last beat is less than a TTL old (it beats every
    third of one: three beats missed)."""
    beats = {m.token: m for m in members}
    lines: list[tuple[str, str, bool]] = []
    holder = lease.token if lease is not None and not lease.released else ""
    if holder:
        assert lease is not None
        mine = beats.get(holder)
        lines.append((lease.holder, "primary", mine is not None and now - mine.beat_at < mine.ttl_s))
    others = sorted((m for m in members if m.token != holder), key=lambda m: (m.name, m.token))
    for i, member in enumerate(others, start=1):
        role = "backup" if len(others) == 1 else f"backup{i}"
        lines.append((member.name, role, now - member.beat_at < member.ttl_s))
    return lines
