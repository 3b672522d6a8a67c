"""sreport: TRES-seconds by account and user, and the cluster's capacity, summed from the read model.

``summarise`` is pure: the runs (``attempts`` rows with their job's account and user) and the nodes'
periods (``node_periods``) that overlap the window, each clipped to it and to ``now`` (a run still going,
or a node still up, counts until now, never into the future). A run's TRES-seconds are its count of the
TRES (CPUs or GPUs over all its nodes) times its time in the window. ``report`` fetches the rows.

Slurm reports from hourly rollups and so rounds the window to whole hours; Corral sums the rows themselves,
so any window is exact to the second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

from corral.libs.runtime.errors import InvalidInput
from corral.libs.runtime.store import Connection
from corral.schemas.api import ReportReply, ReportRequest, TresCapacity, TresUsage
from corral.services.accounting.report_tree import account_rows

#: Most values one filter list may hold, and the longest name.
MAX_FILTER_VALUES = 10_000
MAX_NAME = 256


class Run(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt of a job, as far as usage goes."""

    account: str  # the job's account
    user: str  # the job's owner
    start: float  # Unix time of the allocation
    end: float | None  # Unix time it ended; None = still running
    cpus: int  # CPUs over all nodes
    gpus: int  # GPUs over all nodes


class Period(msgspec.Struct, frozen=True, kw_only=True):
    """A node's capacity over a time in which it did not change."""

    start: float  # Unix time it began
    end: float | None  # Unix time it ended; None = still so
    cpus: int  # CPUs
    gpus: int  # GPUs
    available: bool  # False: down or drained


def validate(req: ReportRequest) -> None:
    """InvalidInput naming the field if the request is out of bounds."""
    for field, value in (("start", req.start), ("end", req.end)):
        if not math.isfinite(value):
            raise InvalidInput(f"{field} must be a finite Unix time", field=field)
    if req.end <= req.start:
        raise InvalidInput("end must be after start", field="end")
    if not req.tres or len(set(req.tres)) != len(req.tres):
        raise InvalidInput("tres: name each TRES once (cpu, gres/gpu)", field="tres")
    for field, names in (("users", req.users), ("accounts", req.accounts)):
        if len(names) > MAX_FILTER_VALUES:
            raise InvalidInput(f"{field}: at most {MAX_FILTER_VALUES} values", field=field)
        if any(not 0 < len(name) <= MAX_NAME or "\x00" in name for name in names):
            raise InvalidInput(f"{field}: names are 1-{MAX_NAME} characters", field=field)


def overlap(start: float, end: float | None, window: tuple[float, float], now: float) -> int:
    """Whole seconds of [start, end) (end None: until ``now``) inside the window, never after ``now``.

    Cut to whole seconds as sacct's ElapsedRaw is, so a run inside the window counts exactly ElapsedRaw.
    """
    stop = min(now if end is None else end, window[1], now)
    return int(max(0.0, stop - max(start, window[0])))


def _count(tres: str, cpus: int, gpus: int) -> int:
    return gpus if tres == "gres/gpu" else cpus


def summarise(
    req: ReportRequest,
    runs: Sequence[Run],
    periods: Sequence[Period],
    now: float,
    cluster: str = "",
    parents: Mapping[str, str] | None = None,
) -> ReportReply:
    """The report of ``req`` from the rows overlapping its window (the users/accounts filters only narrow
    the usage; the cluster's allocated time counts every run). ``parents`` (each account's parent
    account) shapes the account tree of AccountUtilizationByUser (``report_tree``)."""
    window = (req.start, req.end)
    capacity: list[TresCapacity] = []
    usage: list[TresUsage] = []
    # Every (account, user) that ran in the window -> its TRES-seconds, one per TRES asked.
    used: dict[tuple[str, str], list[float]] = {}
    for index, tres in enumerate(req.tres):
        allocated = 0.0
        by_owner: dict[tuple[str, str], float] = {}
        for run in runs:
            seconds = _count(tres, run.cpus, run.gpus) * overlap(run.start, run.end, window, now)
            allocated += seconds
            key = (run.account, run.user)
            used.setdefault(key, [0.0] * len(req.tres))[index] += seconds
            if (not req.users or run.user in req.users) and (not req.accounts or run.account in req.accounts):
                by_owner[key] = by_owner.get(key, 0.0) + seconds
        reported = down = 0.0
        for period in periods:
            seconds = _count(tres, period.cpus, period.gpus) * overlap(period.start, period.end, window, now)
            reported += seconds
            down += 0.0 if period.available else seconds
        capacity.append(TresCapacity(tres=tres, allocated=allocated, down=down, reported=reported))
        usage += [
            TresUsage(tres=tres, account=account, user=user, seconds=seconds)
            for (account, user), seconds in sorted(by_owner.items())
        ]
    accounts = account_rows(used, parents or {}, req.users, req.accounts)
    return ReportReply(
        cluster=cluster, start=req.start, end=req.end, capacity=capacity, usage=usage, accounts=accounts
    )


_RUNS = (
    "SELECT j.account, j.user_name, a.start_time, a.end_time, a.num_cpus, a.num_gpus"
    " FROM attempts a JOIN jobs j USING (job_id)"
    " WHERE a.start_time < $2::float8 AND (a.end_time IS NULL OR a.end_time > $1::float8)"
)
_PERIODS = (
    "SELECT start_time, end_time, cpus, gpus, available FROM node_periods"
    " WHERE start_time < $2::float8 AND (end_time IS NULL OR end_time > $1::float8)"
)


async def report(
    conn: Connection, req: ReportRequest, now: float, cluster: str, parents: Mapping[str, str] | None = None
) -> ReportReply:
    """Answer an sreport request from the read model (validates it first)."""
    validate(req)
    runs = [
        Run(
            account=row["account"],
            user=row["user_name"],
            start=row["start_time"],
            end=row["end_time"],
            cpus=row["num_cpus"],
            gpus=row["num_gpus"],
        )
        for row in await conn.fetch(_RUNS, req.start, req.end)
    ]
    periods = [
        Period(
            start=row["start_time"],
            end=row["end_time"],
            cpus=row["cpus"],
            gpus=row["gpus"],
            available=row["available"],
        )
        for row in await conn.fetch(_PERIODS, req.start, req.end)
    ]
    return summarise(req, runs, periods, now, cluster, parents)
