"""The ``[accounting]`` table of the cluster configuration: how the accounting projection is shared.

``partitions``: the projection is split into this many partitions by row owner (a job's rows by its id,
node and epoch rows in partition 0); each has its own durable consumer and position, and the accounting
processes share them (``docs/decisions/accounting.md``). 1, the default, is a single projection named
``accounting``, as before partitions existed. ``lease_ttl``: how long a partition's lease lasts without a
renewal, so how soon a surviving process takes over the partition of a dead one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corral.libs.config import values as cv
from corral.libs.config.values import ConfigError
from corral.libs.core.lease import DEFAULT_TTL_S

#: The most partitions a projection may have: each one folds the whole log and holds a lease.
MAX_PARTITIONS = 64


@dataclass(frozen=True)
class AccountingConfig:
    """How the accounting processes share the projection."""

    partitions: int = 1  # partitions of the projection (1: the single ``accounting`` projection)
    lease_ttl_s: float = DEFAULT_TTL_S  # a partition's lease TTL: a survivor takes over about this long after


def parse_accounting(raw: Any) -> AccountingConfig:
    """The ``[accounting]`` table, validated (each error names its key)."""
    table = cv.table(raw, "accounting")
    partitions = cv.optional(table, "partitions", "accounting", int, 1)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ConfigError(f"accounting.partitions: must be 1 to {MAX_PARTITIONS}, got {partitions}")
    ttl = table.get("lease_ttl", DEFAULT_TTL_S)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0.5 <= ttl <= 300:
        raise ConfigError(f"accounting.lease_ttl: must be 0.5 to 300 seconds, got {ttl!r}")
    return AccountingConfig(partitions=partitions, lease_ttl_s=float(ttl))
