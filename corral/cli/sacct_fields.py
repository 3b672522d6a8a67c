"""sacct's fields: what each column prints for a job row and for a step row, and ``-S``/``-E`` times."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING

import msgspec

from corral.cli.errors import CliError
from corral.cli.jobrefs import job_label
from corral.libs.slurm import hostlist
from corral.libs.slurm.timefmt import format_elapsed_sacct, format_timestamp
from corral.libs.slurm.tres import gres_string, tres_string

if TYPE_CHECKING:
    from corral.schemas.api import AcctJob, AcctStep


class RowContext(msgspec.Struct, frozen=True):
    """What rows depend on besides the record: the clock, the time zone, and uid lookup."""

    now: float  # Unix time, for the elapsed time of running jobs
    tz: tzinfo | None  # time zone of timestamps; None = local
    uid_of: Callable[[str], str]  # user name -> what "CANCELLED by" shows
    labels: dict[int, str] = {}  # JobID of a row that stands for a pending array's tasks (A_[0-3]), by job id


_JobGetter = Callable[["AcctJob", RowContext], str]
_StepGetter = Callable[["AcctJob", "AcctStep", RowContext], str]


class Column(msgspec.Struct, frozen=True):
    """One sacct field."""

    title: str  # Slurm's spelling, printed in the header
    width: int  # fixed-width column size
    right: bool  # right-justified (all but the job ids)
    job: _JobGetter  # value on a job row
    step: _StepGetter  # value on a step row

    def resized(self, width: int) -> Column:
        """The same field with another width (``JobName%30``)."""
        return msgspec.structs.replace(self, width=width)


def _elapsed(start: float | None, end: float | None, now: float) -> int:
    if start is None:
        return 0
    return max(0, int((end if end is not None else now) - start))


def _job_state(job: AcctJob, ctx: RowContext) -> str:
    if job.state == "CANCELLED" and job.cancelled_by:
        return f"CANCELLED by {ctx.uid_of(job.cancelled_by)}"
    return job.state


def _step_nodes(step: AcctStep) -> str:
    return str(len(hostlist.expand(step.node_list))) if step.node_list else "0"


def _started(job: AcctJob) -> bool:
    return job.start_time is not None


def _job_id(job: AcctJob) -> str:
    """JobID: ``A_T`` for an array task, the job id otherwise."""
    return job_label(job.job_id, job.array_job_id, job.array_task_id)


def _row_id(job: AcctJob, context: RowContext) -> str:
    """JobID of a job's row: ``A_[0-3]`` for a row that stands for a pending array's tasks."""
    return context.labels.get(job.job_id) or _job_id(job)


def _array_job_id(job: AcctJob) -> str:
    return "" if job.array_job_id is None else str(job.array_job_id)


def _array_task_id(job: AcctJob) -> str:
    return "" if job.array_task_id is None else str(job.array_task_id)


def _timelimit_raw(job: AcctJob) -> str:
    """TimelimitRaw: the limit in whole minutes (Slurm's unit, rounded up), or UNLIMITED."""
    return "UNLIMITED" if job.time_limit_s is None else str(-(-job.time_limit_s // 60))


def _alloc_cpus(job: AcctJob) -> int:
    return job.num_cpus if _started(job) else 0


def _alloc_tres(job: AcctJob) -> str:
    """AllocTRES of a job: what its (latest) run got; empty if it never ran."""
    if not _started(job):
        return ""
    return tres_string(
        cpus=job.num_cpus,
        gpus=job.num_gpus,
        gpu_type=job.gpu_type,
        mem_mb=job.alloc_mem_mb,
        nodes=job.num_nodes,
    )


def _req_tres(job: AcctJob) -> str:
    """ReqTRES of a job: what it asked for (memory only if it asked a size)."""
    return tres_string(
        cpus=job.req_cpus,
        gpus=job.req_gpus,
        gpu_type=job.gpu_type,
        mem_mb=job.req_mem_mb,
        nodes=job.req_nodes,
    )


def _step_tres(job: AcctJob, step: AcctStep) -> str:
    """AllocTRES of a step: its CPUs, GPUs and nodes (Corral records no per-step memory)."""
    nodes = len(hostlist.expand(step.node_list)) if step.node_list else 0
    return tres_string(
        cpus=step.num_cpus, gpus=step.num_gpus, gpu_type=job.gpu_type, nodes=nodes, billing=False
    )


def _cpu_time(cpus: int, start: float | None, end: float | None, now: float) -> int:
    """CPUTimeRAW: allocated CPUs times the elapsed seconds."""
    return cpus * _elapsed(start, end, now)


def _column(title: str, width: int, job: _JobGetter, step: _StepGetter, right: bool = True) -> Column:
    return Column(title, width, right, job, step)


_ALL = [
    _column(
        "JobID",
        12,
        lambda j, c: c.labels.get(j.job_id) or _job_id(j),
        lambda j, s, c: f"{_job_id(j)}.{s.step}",
        right=False,
    ),
    _column("JobIDRaw", 12, lambda j, c: str(j.job_id), lambda j, s, c: f"{j.job_id}.{s.step}", right=False),
    _column("JobName", 10, lambda j, c: j.name, lambda j, s, c: s.name),
    _column("Partition", 10, lambda j, c: j.partition, lambda j, s, c: ""),
    _column("Account", 10, lambda j, c: j.account, lambda j, s, c: j.account),
    _column("AllocCPUS", 10, lambda j, c: str(_alloc_cpus(j)), lambda j, s, c: str(s.num_cpus)),
    _column("State", 10, _job_state, lambda j, s, c: s.state),
    _column(
        "ExitCode", 8, lambda j, c: f"{j.exit_code}:{j.signal}", lambda j, s, c: f"{s.exit_code}:{s.signal}"
    ),
    _column("NodeList", 15, lambda j, c: j.node_list or "None assigned", lambda j, s, c: s.node_list),
    _column(
        "Elapsed",
        10,
        lambda j, c: format_elapsed_sacct(_elapsed(j.start_time, j.end_time, c.now)),
        lambda j, s, c: format_elapsed_sacct(_elapsed(s.start_time, s.end_time, c.now)),
    ),
    _column(
        "ElapsedRaw",
        10,
        lambda j, c: str(_elapsed(j.start_time, j.end_time, c.now)),
        lambda j, s, c: str(_elapsed(s.start_time, s.end_time, c.now)),
    ),
    _column(
        "Start",
        19,
        lambda j, c: format_timestamp(j.start_time, c.tz),
        lambda j, s, c: format_timestamp(s.start_time, c.tz),
    ),
    _column(
        "End",
        19,
        lambda j, c: format_timestamp(j.end_time, c.tz),
        lambda j, s, c: format_timestamp(s.end_time, c.tz),
    ),
    _column(
        "Submit",
        19,
        lambda j, c: format_timestamp(j.submit_time, c.tz),
        lambda j, s, c: format_timestamp(s.start_time, c.tz),
    ),
    _column("User", 9, lambda j, c: j.user, lambda j, s, c: ""),
    _column("NNodes", 8, lambda j, c: str(j.num_nodes), lambda j, s, c: _step_nodes(s)),
    _column(
        "AllocNodes", 10, lambda j, c: str(j.num_nodes if _started(j) else 0), lambda j, s, c: _step_nodes(s)
    ),
    _column("NCPUS", 10, lambda j, c: str(j.num_cpus), lambda j, s, c: str(s.num_cpus)),
    _column("NTasks", 8, lambda j, c: "", lambda j, s, c: str(s.num_tasks)),
    _column(
        "Timelimit",
        10,
        lambda j, c: "UNLIMITED" if j.time_limit_s is None else format_elapsed_sacct(j.time_limit_s),
        lambda j, s, c: "",
    ),
    _column("WorkDir", 20, lambda j, c: j.workdir, lambda j, s, c: ""),
    _column("ArrayJobID", 12, lambda j, c: _array_job_id(j), lambda j, s, c: _array_job_id(j)),
    _column("ArrayTaskID", 12, lambda j, c: _array_task_id(j), lambda j, s, c: _array_task_id(j)),
    _column("Reason", 20, lambda j, c: j.reason or "None", lambda j, s, c: ""),
    _column("QOS", 10, lambda j, c: j.qos, lambda j, s, c: ""),
    _column("TimelimitRaw", 12, lambda j, c: _timelimit_raw(j), lambda j, s, c: ""),
    _column("AllocTRES", 10, lambda j, c: _alloc_tres(j), lambda j, s, c: _step_tres(j, s)),
    _column("ReqTRES", 10, lambda j, c: _req_tres(j), lambda j, s, c: ""),
    # Corral measures no usage of its own yet (no cgroup statistics): empty, as Slurm prints unknown usage.
    _column("TRESUsageInTot", 14, lambda j, c: "", lambda j, s, c: ""),
    _column(
        "AllocGRES",
        12,
        lambda j, c: gres_string(j.num_gpus, j.gpu_type) if _started(j) else "",
        lambda j, s, c: gres_string(s.num_gpus, j.gpu_type),
    ),
    _column("ReqGRES", 12, lambda j, c: gres_string(j.req_gpus, j.gpu_type), lambda j, s, c: ""),
    _column(
        "CPUTimeRAW",
        10,
        lambda j, c: str(_cpu_time(_alloc_cpus(j), j.start_time, j.end_time, c.now)),
        lambda j, s, c: str(_cpu_time(s.num_cpus, s.start_time, s.end_time, c.now)),
    ),
    _column(
        "CPUTime",
        10,
        lambda j, c: format_elapsed_sacct(_cpu_time(_alloc_cpus(j), j.start_time, j.end_time, c.now)),
        lambda j, s, c: format_elapsed_sacct(_cpu_time(s.num_cpus, s.start_time, s.end_time, c.now)),
    ),
]

#: Fields by lower-case name.
COLUMNS: dict[str, Column] = {column.title.lower(): column for column in _ALL}

#: Slurm fields Corral does not print yet (lower case).
_LATER = (
    "ReqMem ReqCPUS ReqNodes MaxRSS AveRSS MaxVMSize AveVMSize "
    "TotalCPU UserCPU SystemCPU Group GID UID QOSRAW Priority Cluster DerivedExitCode Comment "
    "Constraints Eligible Flags Layout Reservation ReservationId Suspended WCKey WCKeyID AssocID "
    "AdminComment BlockID Container ConsumedEnergy ConsumedEnergyRaw "
    "Extra FailedNode MaxDiskRead MaxDiskWrite MaxPages McsLabel Planned PlannedCPU PlannedCPURAW "
    "StdErr StdIn StdOut SubmitLine TRESUsageInAve TRESUsageInMax "
    "TRESUsageOutAve TRESUsageOutMax TRESUsageOutTot AveCPU MinCPU AveCPUFreq AveDiskRead "
    "AveDiskWrite AvePages HetJobID HetJobOffset"
)
LATER_COLUMNS = frozenset(name.lower() for name in _LATER.split()) - COLUMNS.keys()


def records(job: AcctJob) -> list[AcctJob]:
    """``sacct -D``: each earlier run of ``job`` as a record of its own with the steps that ran in it, oldest
    first, then the job's own record (the steps of the run it is, if it runs or ran)."""
    earlier = [
        msgspec.structs.replace(
            job,
            state=attempt.state,
            partition=attempt.partition,
            start_time=attempt.start_time,
            end_time=attempt.end_time,
            node_list=attempt.node_list,
            num_nodes=attempt.num_nodes,
            num_cpus=attempt.num_cpus,
            num_gpus=attempt.num_gpus,
            alloc_mem_mb=attempt.mem_mb,
            exit_code=attempt.exit_code,
            signal=attempt.signal,
            reason=attempt.reason,
            restart_count=attempt.attempt,
            cancelled_by=None,
            steps=attempt.steps,
            attempts=[],
        )
        for attempt in job.attempts
    ]
    return [*earlier, job]


def job_rows(job: AcctJob, columns: Sequence[Column], ctx: RowContext, steps: bool) -> list[list[str]]:
    """The job's row, then (unless ``steps`` is False) one row per step."""
    rows = [[column.job(job, ctx) for column in columns]]
    if steps:
        rows += [[column.step(job, step, ctx) for column in columns] for step in job.steps]
    return rows


_RELATIVE = re.compile(r"now\s*([+-])\s*([0-9]{1,9})\s*([a-z]*)")
_UNITS = {"": 1, "s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
_UNITS |= {"d": 86400, "day": 86400, "w": 604800, "week": 604800}
_ABSOLUTE = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")
_TIME_FIX = "use YYYY-MM-DD[THH:MM[:SS]], now, now-1hours, now-2days or today"


def parse_time_point(text: str, option: str, now: float, tz: tzinfo | None = None) -> float:
    """A ``-S``/``-E`` time as Unix seconds: ``YYYY-MM-DD[THH:MM[:SS]]``, ``now[+-]N<unit>``, ``today``."""
    value = text.strip().lower()
    if value == "now":
        return now
    if value in ("today", "midnight"):
        today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
        return today.timestamp()
    relative = _RELATIVE.fullmatch(value)
    if relative:
        sign, amount, unit = relative.groups()
        seconds = _UNITS.get(unit.removesuffix("s") if len(unit) > 1 else unit)
        if seconds is None:
            raise CliError(f'invalid {option} "{text}": {_TIME_FIX}')
        delta = int(amount) * seconds
        return now + delta if sign == "+" else now - delta
    for pattern in _ABSOLUTE:
        try:
            moment = datetime.strptime(text.strip(), pattern)
        except ValueError:
            continue
        return (moment.replace(tzinfo=tz) if tz is not None else moment).timestamp()
    raise CliError(f'invalid {option} "{text}": {_TIME_FIX}')
