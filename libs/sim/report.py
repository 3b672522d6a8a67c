"""What a simulation reports: wait and slowdown statistics, utilisation, and the per-job CSV.

Definitions (the Parallel Workloads Archive's, so numbers compare with published ones):

- wait = start - submit; p50/p95 are nearest-rank percentiles;
- bounded slowdown = max(1, (wait + run) / max(run, 10 s)), run = end - start;
- utilisation = sum(run * units) / (capacity * makespan);
- makespan = last end - first submit.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from corral.libs.sim.engine import JobRecord, SimResult
from corral.libs.slurm.hostlist import compress

#: Runs shorter than this count as this long in the bounded slowdown.
SLOWDOWN_BOUND_S = 10.0

STARTS_HEADER = ("id", "submit", "start", "end", "nodes")


@dataclass(frozen=True)
class Metrics:
    """Summary of one simulation."""

    jobs: int  # jobs simulated
    mean_wait: float  # seconds
    p50_wait: float  # seconds
    p95_wait: float  # seconds
    max_wait: float  # seconds
    mean_bounded_slowdown: float  # threshold SLOWDOWN_BOUND_S
    utilisation: float  # 0..1
    makespan: float  # seconds


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0..100) of ascending values (0 for none)."""
    if not ordered:
        return 0.0
    rank = max(math.ceil(q / 100 * len(ordered)), 1)
    return ordered[rank - 1]


def bounded_slowdown(wait: float, run: float) -> float:
    """max(1, (wait + run) / max(run, 10 s))."""
    return max(1.0, (wait + run) / max(run, SLOWDOWN_BOUND_S))


def metrics(result: SimResult) -> Metrics:
    """The summary of a simulation's records."""
    records = result.records
    if not records:
        return Metrics(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    waits = sorted(r.start - r.submit for r in records)
    slowdowns = [bounded_slowdown(r.start - r.submit, r.end - r.start) for r in records]
    makespan = max(r.end for r in records) - min(r.submit for r in records)
    work = sum((r.end - r.start) * r.units for r in records)
    return Metrics(
        jobs=len(records),
        mean_wait=sum(waits) / len(waits),
        p50_wait=percentile(waits, 50),
        p95_wait=percentile(waits, 95),
        max_wait=waits[-1],
        mean_bounded_slowdown=sum(slowdowns) / len(slowdowns),
        utilisation=work / (result.capacity * makespan) if makespan > 0 else 0.0,
        makespan=makespan,
    )


def _rows(m: Metrics) -> list[tuple[str, str]]:
    """(name, value) of each metric, formatted."""
    return [
        ("jobs", f"{m.jobs}"),
        ("mean wait (s)", f"{m.mean_wait:.1f}"),
        ("p50 wait (s)", f"{m.p50_wait:.1f}"),
        ("p95 wait (s)", f"{m.p95_wait:.1f}"),
        ("max wait (s)", f"{m.max_wait:.1f}"),
        ("mean bounded slowdown", f"{m.mean_bounded_slowdown:.2f}"),
        ("utilisation", f"{m.utilisation:.3f}"),
        ("makespan (s)", f"{m.makespan:.0f}"),
    ]


def format_metrics(m: Metrics) -> str:
    """The metrics as an aligned two-column table."""
    rows = _rows(m)
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def format_comparison(columns: Sequence[tuple[str, Metrics]]) -> str:
    """Several runs' metrics side by side: a header line of the column titles, then one row per metric."""
    tables = [(title, _rows(m)) for title, m in columns]
    names = [name for name, _ in tables[0][1]]
    width = max(len(name) for name in names)
    widths = [max(len(title), *(len(v) for _, v in rows)) for title, rows in tables]
    lines = [" " * width + "".join(f"  {title:>{w}}" for (title, _), w in zip(tables, widths, strict=True))]
    for i, name in enumerate(names):
        cells = "".join(f"  {rows[i][1]:>{w}}" for (_, rows), w in zip(tables, widths, strict=True))
        lines.append(f"{name:<{width}}{cells}")
    return "\n".join(lines)


def _time(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def write_starts(records: Iterable[JobRecord], out: TextIO) -> None:
    """One CSV row per job: id, submit, start, end, nodes (a Slurm hostlist of its nodes)."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(STARTS_HEADER)
    for r in records:
        writer.writerow(
            (r.id, _time(r.submit), _time(r.start), _time(r.end), compress(r.nodes) if r.nodes else "")
        )
