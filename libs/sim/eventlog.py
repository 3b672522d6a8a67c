"""What-if replay: a Corral event log (``corral log export``) as a simulator workload, parsed purely.

**File.** JSON lines, one log entry per line: ``{"seq": <stream sequence>, "envelope": <Envelope>}``
(``LogLine``), in sequence order, exactly as the scheduler folds them.

**Workload.** The whole log is folded with the scheduler's own fold (``fold.apply``), so a job array
is expanded into its tasks exactly as the scheduler did, updates (``JobUpdated``) are applied, and each
job's last run is where the fold left it. From the final state:

- every job that ran and ended becomes one ``SimJob``: its submit time, the spec it last had, and its
  run time = end of its last run (its conclusion: ``JobCompleted``/``JobFailed``/``JobCancelled``)
  minus that run's start (``JobAllocated``), i.e. how long it really held its nodes;
- the spec keeps every resource request (nodes, tasks, CPUs, memory, GPUs and type, partition, time
  limit, ``-w``/``-x``/``-C``/``--exclusive``, account, QOS, nice) and its begin time (``--begin``: an
  absolute time in the log's clock, which the simulator honours by planning again at the plan's
  ``wake_at``), but not the rest of the workflow: array (each task is a job of its own, so ``%P``
  throttles are not replayed), dependencies, ``-H`` holds and advance reservations (``--reservation``)
  are dropped, since their real release times and windows are not requests a replay can honour (a
  dependency may name a job that is not replayed; a hold's release is an operator's act; the
  reservations themselves are not replayed);
- jobs that never ran (cancelled or failed while pending) and jobs still pending or running when the
  log was exported are **skipped** (counted in ``LogWorkload.skipped``): they held nothing, or their
  run time is not known, and simulating them with their time limit would invent load;
- what really happened is one ``JobRecord`` per simulated job (start and end of its last run, its
  nodes, GPUs held, final state), so the same metrics compare the real schedule with the simulated one.

Times stay in the log's clock (Unix seconds, not rounded). A line that is not a log entry raises
``WorkloadError`` naming the file and the line.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from corral.libs.core.fold import apply
from corral.libs.core.policy import PartitionPolicy
from corral.libs.core.state import Job, State
from corral.libs.sim.engine import JobRecord, SimCluster
from corral.libs.sim.workload import SimJob, WorkloadError
from corral.schemas import events as ev


class LogLine(msgspec.Struct, frozen=True, kw_only=True):
    """One line of an exported log."""

    seq: int  # the entry's stream sequence
    envelope: ev.Envelope  # the entry


_line_decoder = msgspec.json.Decoder(LogLine)
_line_encoder = msgspec.json.Encoder()


def encode_line(seq: int, envelope: ev.Envelope) -> bytes:
    """One log entry as a line of the export file (newline included)."""
    return _line_encoder.encode(LogLine(seq=seq, envelope=envelope)) + b"\n"


def parse_log(data: bytes, source: str = "<string>") -> list[tuple[int, ev.Envelope]]:
    """The entries (sequence, envelope) of an exported log, in file order."""
    entries: list[tuple[int, ev.Envelope]] = []
    last = 0
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = _line_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            raise WorkloadError(source, number, f"not a log entry ({exc})") from None
        if line.seq <= last:
            raise WorkloadError(source, number, f"sequence {line.seq} after {last}: the log is out of order")
        last = line.seq
        entries.append((line.seq, line.envelope))
    return entries


def looks_like_log(head: bytes, source: str) -> bool:
    """True if a workload file is an exported log (``.jsonl``, or its first character is ``{``)."""
    return source.endswith(".jsonl") or head.lstrip().startswith(b"{")


@dataclass(frozen=True)
class LogWorkload:
    """A log as the simulator sees it."""

    jobs: tuple[SimJob, ...]  # jobs that ran and ended, by (submit, id)
    actual: tuple[JobRecord, ...]  # what really happened to each of them, in the same order
    nodes: tuple[ev.NodeRegistered, ...]  # every node's newest registration, in registration order
    skipped: int  # jobs that never ran, or had not ended when the log was exported


def _units(job: Job) -> int:
    gpus = sum(len(a.gpus) for a in job.allocations)
    return gpus or len(job.allocations)


def _replayed_spec(spec: ev.JobSpec) -> ev.JobSpec:
    """The resource request and begin time of a spec, without the workflow the replay cannot honour."""
    return msgspec.structs.replace(spec, array=None, dependencies=None, held=False, reservation=None)


def log_workload(entries: list[tuple[int, ev.Envelope]]) -> LogWorkload:
    """Fold the log and read each job's submission and last run (see the module docstring)."""
    state = State()
    for seq, envelope in entries:
        apply(state, seq, envelope)
    jobs: list[SimJob] = []
    actual: list[JobRecord] = []
    skipped = 0
    for job in sorted(state.jobs.values(), key=lambda j: (j.submit_time, j.job_id)):
        start, end = job.start_time, job.end_time
        if job.state in ("PENDING", "RUNNING") or start is None or end is None or not job.allocations:
            skipped += 1
            continue
        spec = _replayed_spec(job.spec)
        run = max(end - start, 0.0)
        units = _units(job)
        jobs.append(
            SimJob(
                id=job.job_id,
                submit=job.submit_time,
                run_time=run,
                req_time=spec.time_limit_s,
                units=units,
                nodes=spec.nodes,
                gpus_per_node=spec.gpus_per_node,
                gpu_type=spec.gpu_type,
                user=job.user,
                partition=spec.partition,
                spec=spec,
            )
        )
        nodes = tuple(a.node for a in job.allocations)
        actual.append(JobRecord(job.job_id, job.submit_time, start, end, units, nodes, job.state))
    registrations = tuple(
        ev.NodeRegistered(
            node=n.name,
            cpus=n.cpus,
            mem_mb=n.mem_mb,
            gpus=n.gpus,
            gpu_type=n.gpu_type,
            partitions=list(n.partitions),
            features=list(n.features),
        )
        for n in state.nodes.values()
    )
    return LogWorkload(tuple(jobs), tuple(actual), registrations, skipped)


def log_cluster(nodes: tuple[ev.NodeRegistered, ...]) -> SimCluster:
    """The cluster the log's nodes registered: their partitions (the first is the default), no time
    limits (the log does not hold them: give ``--config`` for MaxTime/DefaultTime); capacity in GPUs."""
    names: list[str] = []
    for node in nodes:
        names.extend(p for p in node.partitions if p not in names)
    parts = tuple(PartitionPolicy(name, i == 0, None, None) for i, name in enumerate(names))
    gpus = sum(n.gpus for n in nodes)
    return SimCluster(nodes, parts, gpus or len(nodes))
