"""Workloads for the simulator: Standard Workload Format traces and CSVs of GPU jobs, parsed purely.

Both parsers take the text (the CLI reads the file) and return ``SimJob`` records sorted by
(submit, id). A malformed line raises ``WorkloadError`` naming the source and the line number.

**SWF** (Parallel Workloads Archive; 18 whitespace-separated columns, ``;`` starts a comment line,
-1 = unknown): job, submit, wait, run, alloc_procs, avg_cpu, used_mem, req_procs, req_time, req_mem,
status, user, group, app, queue, partition, preceding_job, think_time. Conventions:

- units (processors) = alloc_procs if > 0, else req_procs; a job with no positive count gets 1;
- a job whose run time is <= 0 runs for 1 s;
- requested time (the job's time limit) = max(req_time, run_time, 1);
- it runs for max(min(req_time, run_time), 1) when req_time > 0, else for run_time.

**GPU CSV** (a header line, then one job per line; ``#`` lines and blank lines are ignored):

============== ======== ===========================================================================
column         required meaning
============== ======== ===========================================================================
id             yes      job id, a positive integer, unique
submit         yes      submit time in seconds (integer, any origin)
duration       yes      how long the job runs, seconds (integer >= 1; cut at time_limit if longer)
time_limit     yes      requested time in seconds (integer >= 1), or empty for the partition default
nodes          yes      number of nodes (integer >= 1)
gpus_per_node  yes      GPUs on each node (integer >= 0)
gpu_type       no       required GPU model (e.g. ``h100``); empty = any
user           no       owner (default ``sim``)
partition      no       partition; empty = the cluster's default
============== ======== ===========================================================================

Columns may come in any order; unknown columns are an error (a typo must not pass silently).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from corral.schemas.events import JobSpec

#: SWF column indices (0-based) used here.
_SWF_ID, _SWF_SUBMIT, _SWF_RUN, _SWF_ALLOC, _SWF_REQ_PROCS, _SWF_REQ_TIME = 0, 1, 3, 4, 7, 8
_SWF_COLUMNS = 18

CSV_REQUIRED = ("id", "submit", "duration", "time_limit", "nodes", "gpus_per_node")
CSV_OPTIONAL = ("gpu_type", "user", "partition")


class WorkloadError(ValueError):
    """A trace that cannot be read; ``str()`` is one line naming the source and the line number."""

    def __init__(self, source: str, line: int, message: str) -> None:
        super().__init__(f"{source}:{line}: {message}")
        self.source = source  # file name (or "<string>")
        self.line = line  # 1-based line number, 0 for the file as a whole
        self.message = message  # what is wrong


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of a workload, in simulator terms."""

    id: int  # job id (the log's job id)
    submit: float  # submit time, seconds (whole seconds in traces; the log's clock in a what-if replay)
    run_time: float  # how long it runs once started, seconds (>= 1 in traces)
    req_time: int | None  # requested time = time limit, seconds (None: the partition's default)
    units: int  # schedulable units held: processors (SWF) or GPUs (nodes for a GPU-less job)
    nodes: int = 0  # nodes (0: one node per unit, the SWF processor model)
    gpus_per_node: int = 0  # GPUs on each node
    gpu_type: str | None = None  # required GPU model
    user: str = "sim"  # owner
    partition: str | None = None  # partition (None: the default)
    spec: JobSpec | None = None  # the whole request, when replaying a log (None: built from the fields)

    @property
    def node_count(self) -> int:
        """Nodes the job asks for."""
        return self.nodes or self.units


def _int(text: str, source: str, line: int, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise WorkloadError(source, line, f"{what}: {text!r} is not a number") from None
        if not value.is_integer():
            raise WorkloadError(source, line, f"{what}: {text!r} is not a whole number of seconds") from None
        return int(value)


def swf_job(fields: list[str], source: str = "<string>", line: int = 0) -> SimJob:
    """One SWF record (its whitespace-separated fields) with the conventions of the module docstring."""
    if len(fields) < _SWF_REQ_TIME + 1:
        raise WorkloadError(source, line, f"{len(fields)} fields, an SWF record has {_SWF_COLUMNS}")
    names = {_SWF_ID: "job", _SWF_SUBMIT: "submit", _SWF_RUN: "run_time"}
    names |= {_SWF_ALLOC: "alloc_procs", _SWF_REQ_PROCS: "req_procs", _SWF_REQ_TIME: "req_time"}
    v = {i: _int(fields[i], source, line, name) for i, name in names.items()}
    if v[_SWF_ID] <= 0:
        raise WorkloadError(source, line, f"job: {v[_SWF_ID]} is not a positive job number")
    if v[_SWF_SUBMIT] < 0:
        raise WorkloadError(source, line, f"submit: {v[_SWF_SUBMIT]} is negative")
    run, req = v[_SWF_RUN], v[_SWF_REQ_TIME]
    procs = v[_SWF_ALLOC] if v[_SWF_ALLOC] > 0 else v[_SWF_REQ_PROCS]
    requested = max(req, run, 1)
    runs = max(min(req, run), 1) if req > 0 else max(run, 1)
    return SimJob(v[_SWF_ID], v[_SWF_SUBMIT], runs, requested, max(procs, 1))


def parse_swf(text: str, source: str = "<string>") -> list[SimJob]:
    """Every job of an SWF trace, sorted by (submit, id)."""
    jobs: list[tuple[int, SimJob]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith(";"):
            continue
        jobs.append((number, swf_job(stripped.split(), source, number)))
    return _checked(jobs, source)


def _checked(jobs: list[tuple[int, SimJob]], source: str) -> list[SimJob]:
    """The jobs sorted by (submit, id), after checking that no id repeats."""
    first: dict[int, int] = {}
    for number, job in jobs:
        if job.id in first:
            raise WorkloadError(source, number, f"job id {job.id} already used on line {first[job.id]}")
        first[job.id] = number
    return sorted((job for _, job in jobs), key=lambda j: (j.submit, j.id))


def _csv_job(row: dict[str, str], source: str, line: int) -> SimJob:
    def number(name: str, low: int) -> int:
        value = _int(row[name].strip(), source, line, name)
        if value < low:
            raise WorkloadError(source, line, f"{name}: {value} is below {low}")
        return value

    limit_text = row["time_limit"].strip()
    limit = number("time_limit", 1) if limit_text else None
    duration = number("duration", 1)
    nodes, gpus = number("nodes", 1), number("gpus_per_node", 0)
    return SimJob(
        id=number("id", 1),
        submit=number("submit", 0),
        run_time=min(duration, limit) if limit is not None else duration,
        req_time=limit,
        units=nodes * gpus if gpus else nodes,
        nodes=nodes,
        gpus_per_node=gpus,
        gpu_type=(row.get("gpu_type") or "").strip() or None,
        user=(row.get("user") or "").strip() or "sim",
        partition=(row.get("partition") or "").strip() or None,
    )


def parse_gpu_csv(text: str, source: str = "<string>") -> list[SimJob]:
    """Every job of a GPU-job CSV (columns in the module docstring), sorted by (submit, id)."""
    lines = [
        (number, raw)
        for number, raw in enumerate(text.splitlines(), 1)
        if raw.strip() and not raw.lstrip().startswith("#")
    ]
    if not lines:
        raise WorkloadError(source, 0, "empty workload: expected a header line " + ",".join(CSV_REQUIRED))
    header_line, header_text = lines[0]
    header = [h.strip() for h in next(csv.reader([header_text]))]
    missing = [c for c in CSV_REQUIRED if c not in header]
    unknown = [c for c in header if c not in CSV_REQUIRED + CSV_OPTIONAL]
    if missing or unknown or len(set(header)) != len(header):
        problem = f"missing columns {missing}" if missing else f"unknown or repeated columns {unknown}"
        raise WorkloadError(source, header_line, f"bad header: {problem}; expected {','.join(CSV_REQUIRED)}")
    jobs: list[tuple[int, SimJob]] = []
    for number, raw in lines[1:]:
        cells = next(csv.reader(io.StringIO(raw)))
        if len(cells) != len(header):
            raise WorkloadError(source, number, f"{len(cells)} fields, the header has {len(header)}")
        jobs.append((number, _csv_job(dict(zip(header, cells, strict=True)), source, number)))
    return _checked(jobs, source)


def parse_workload(text: str, source: str = "<string>") -> list[SimJob]:
    """An SWF trace or a GPU CSV, told apart by the file name (``.csv``) or the first data line."""
    if source.endswith(".csv"):
        return parse_gpu_csv(text, source)
    if source.endswith(".swf"):
        return parse_swf(text, source)
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped and not stripped.startswith((";", "#")):
            return parse_gpu_csv(text, source) if "," in stripped else parse_swf(text, source)
    return []
