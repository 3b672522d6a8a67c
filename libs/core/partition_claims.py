"""Accounting partitions among accounting processes: which process projects which partition, pure.

The accounting projection is split into ``P`` partitions (``[accounting] partitions``); partition ``k`` of
``P`` is one lease key of the leader bucket (``partition_key``), held with the scheduler's lease rules
(``lease.next_step``: a compare-and-set write per take or renewal, a lapse timed by the reader's clock).
Accounting process ``--replica i`` prefers partition ``i % P`` (``preferred``) and beats its presence
(``presence_key``). For one process and one partition, ``claim`` says what to do:

- **Its preferred partition:** the lease rule as it is: take it when missing, released or lapsed (its holder
  died), renew it while held. Two processes that prefer one partition (more replicas than partitions) are
  a holder and a standby, as two schedulers are.
- **Another partition, while a process that prefers it is alive** (its presence beat is younger than its
  TTL): hand it back: release it if held (the shell stops its projection first), never take it. So a
  restarted process gets its partition back within a poll of its first beat.
- **Another partition, with no live process that prefers it:** take it when its lease lapsed, was released
  or is missing, and renew it while held. So one surviving process projects every partition.

Correctness never depends on these rules: each partition's transaction locks its position row, so two
holders for a moment apply nothing twice; the rules only share the work.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec

from corral.libs.core import lease

#: Name of the accounting projection with one partition: its consumer, position row and lease key.
ACCOUNTING = "accounting"
#: The leader bucket's keys of the accounting processes' presences (not ``member.*``: those are the
#: schedulers' that ``scontrol ping`` lists).
PRESENCE_PREFIX = f"{ACCOUNTING}.replica."


class Presence(msgspec.Struct, frozen=True, kw_only=True):
    """An accounting process's presence (``presence_key(replica)`` in the leader bucket)."""

    replica: int  # its ``--replica`` index: it prefers partition ``replica % P``
    name: str  # its process name (for the logs)
    token: str  # its process's random id
    beat_at: float  # wall-clock time of its latest beat (Unix seconds)
    ttl_s: float  # its lease TTL: it beats every ``ttl_s / 3``


@dataclass(frozen=True)
class Claim:
    """What to do with one partition's lease now: ``take`` (a CAS on the revision read; 0: create),
    ``renew``, ``release`` (hand it back), or ``wait``."""

    action: Literal["take", "renew", "release", "wait"]
    epoch: int = 0  # the epoch of the lease to write (take, renew): one more on every takeover


def partition_name(k: int, partitions: int) -> str:
    """Partition ``k`` of ``partitions``: its durable consumer, position row and lease key.

    With one partition it is ``accounting``, the name of the single projection before partitions existed,
    so a database and a consumer of that release carry on unchanged. (A dash, not a dot: JetStream consumer
    names take no dots.)"""
    return ACCOUNTING if partitions == 1 else f"{ACCOUNTING}-p{k}of{partitions}"


def partition_key(k: int, partitions: int) -> str:
    """The leader bucket's key of partition ``k``'s lease."""
    return partition_name(k, partitions)


def presence_key(replica: int) -> str:
    """The leader bucket's key of accounting replica ``replica``'s presence."""
    return f"{PRESENCE_PREFIX}{replica}"


def preferred(replica: int, partitions: int) -> int:
    """The partition replica ``replica`` projects while it is alive."""
    return replica % partitions


def alive(now: float, presences: Iterable[Presence]) -> frozenset[int]:
    """The replicas whose latest beat (wall clock ``now``) is younger than their TTL (three beats missed)."""
    return frozenset(p.replica for p in presences if now - p.beat_at < p.ttl_s)


def claim(
    now: float,
    key: lease.Seen,
    token: str,
    renewed_at: float | None,
    ttl_s: float,
    *,
    partition: int,
    partitions: int,
    replica: int,
    live: frozenset[int],
) -> Claim:
    """The rule (module docstring) for process ``token`` (``replica``) and ``partition``: ``key`` is the
    partition's lease as last read, ``renewed_at`` when we sent our last successful write of it (None:
    never, or lost), ``live`` the replicas alive (``alive``)."""
    mine = preferred(replica, partitions) == partition
    wanted = any(preferred(r, partitions) == partition for r in live if r != replica)
    if not mine and wanted:
        held = key.lease is not None and key.lease.token == token and not key.lease.released
        return Claim("release") if held and renewed_at is not None else Claim("wait")
    step = lease.next_step(now, key, token, renewed_at, ttl_s, 0)
    return Claim(step.action, step.epoch)
