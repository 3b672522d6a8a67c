"""The ``report`` verb (sreport): TRES-seconds used by account and user, and the cluster's capacity, in a
window. The accounting service sums its ``attempts`` and ``node_periods`` rows; the command turns seconds
into Slurm's units (minutes, hours, percent) and its report layouts.
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: The TRES sreport can report on: CPUs (Slurm's default) and GPUs.
ReportTres = Literal["cpu", "gres/gpu"]


class ReportRequest(msgspec.Struct, frozen=True, tag="report", kw_only=True):
    """sreport: usage in the window [start, end) for each TRES asked."""

    start: float  # Unix time, inclusive
    end: float  # Unix time, exclusive; after start
    tres: list[ReportTres] = msgspec.field(default_factory=lambda: ["cpu"])  # --tres, at least one
    users: list[str] = []  # Users=: only these users' usage (empty: all)
    accounts: list[str] = []  # Accounts=: only these accounts' usage (empty: all)


class TresUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One (account, user)'s use of one TRES in the window."""

    tres: str  # "cpu" or "gres/gpu"
    account: str  # the jobs' account
    user: str  # the jobs' owner
    seconds: float  # TRES-seconds: count x time, each run clipped to the window


class TresCapacity(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster's capacity of one TRES in the window (sreport cluster utilization)."""

    tres: str  # "cpu" or "gres/gpu"
    allocated: float  # TRES-seconds allocated to runs
    down: float  # TRES-seconds of nodes down or drained
    reported: float  # TRES-seconds of every registered node (idle is the rest)


class AssocUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One row of AccountUtilizationByUser: an account (its whole subtree) or one user in an account.

    The rows come in Slurm's order: depth first from the top, each account's row followed by its users'
    rows (by name), then its sub-accounts (by name). Only associations with usage in the window appear.
    """

    account: str  # the account (for a user's row, the account the user charged)
    user: str = ""  # the user; "" for the account's own row
    depth: int = 0  # levels below the top row shown (sreport's ``tree`` indents by one space a level)
    seconds: list[float] = []  # TRES-seconds, one per entry of ``capacity``, in the same order


class ReportReply(msgspec.Struct, frozen=True, tag="report_reply", kw_only=True):
    """The window as the service used it, the cluster's capacity and every (account, user)'s usage."""

    cluster: str  # cluster name
    start: float  # as requested
    end: float  # as requested
    capacity: list[TresCapacity]  # one per TRES asked, in request order
    usage: list[TresUsage]  # by TRES, account, user
    accounts: list[AssocUsage] = []  # AccountUtilizationByUser's rows, in Slurm's order
