"""``squeue``: the live queue, in Slurm's ``-o``/``-O`` formats.

Rendering is a pure function of (jobs, options, now): ``render_jobs``; ``main`` only parses, calls the
``jobs`` verb and prints.

Array tasks show as ``A_T`` in ``%i``. As in Slurm, the pending tasks of an array that never ran are one
row, ``A_[x-y%P]`` (one per pending reason), unless ``-r``/``--array`` asks for a row per task.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import tzinfo
from typing import TYPE_CHECKING

import msgspec

from corral.cli.errors import CliError, run_command
from corral.cli.fields import FieldSpec, Layout, parse_layout, parse_states, render_layout, state_code
from corral.cli.jobrefs import JobRef, ids_of, job_label, named, parse_job_refs, split_job_list
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported, version_text
from corral.cli.squeue_sort import DEFAULT_SORT, START_SORT, parse_sort, sort_jobs
from corral.libs.slurm.array import pending_array_rows
from corral.libs.slurm.memory import format_memory
from corral.libs.slurm.timefmt import format_elapsed, format_time_limit, format_timestamp

if TYPE_CHECKING:
    from corral.schemas.api import JobInfo, JobsRequest

COMMAND = "squeue"
DEFAULT_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R"
LONG_FORMAT = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R"
START_FORMAT = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %20Y %R"
#: Width of a ``-O`` field given without one, as in Slurm.
DEFAULT_LONG_WIDTH = 20
_TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}
)

OPTIONS = OptionTable(
    [
        Opt("format", "o"),
        Opt("Format", "O"),
        flag("noheader", "h"),
        flag("me"),
        Opt("user", "u"),
        Opt("jobs", "j"),
        Opt("partition", "p"),
        Opt("states", "t"),
        Opt("name", "n"),
        Opt("account", "A"),
        Opt("nodelist", "w"),
        Opt("qos", "q"),
        flag("start"),
        flag("long", "l"),
        flag("all", "a"),
        flag("array", "r"),
        Opt("sort", "S"),
        flag("help"),
        flag("usage"),
        flag("version", "V"),
        *unsupported(
            "array-unique clusters/M federation hide iterate/i local licenses/L noconvert "
            "reservation/R sibling steps/s verbose/v json yaml only-job-state "
            "notme expand-patterns"
        ),
    ]
)

USAGE = """\
Usage: squeue [OPTIONS...]
  -o, --format=FORMAT    %-fields: %i %j %t %T %M %L %D %C %m %b %R %u %P %Q %S %V %r %a %l %N %Z %E
                         %A %F %K, with widths like %.18i (right) or %-10j (left)
  -O, --Format=FIELDS    JobID,Name,State,...[:[.]WIDTH]
  -h, --noheader         no header line         -l, --long     long format
  -u, --user=USERS       only these users           --me       only my jobs
  -j, --jobs=IDS         only these jobs        -p, --partition=NAMES
  -t, --states=STATES    PD,R,... or all        -n, --name=NAMES   -A, --account=NAMES
  -w, --nodelist=HOSTS   only jobs on these nodes (hostlist, e.g. node[1-2])   -q, --qos=NAMES
      --start            pending jobs with their expected start time
  -r, --array            one row per array task (pending tasks are one A_[x-y%P] row otherwise)
  -S, --sort=KEYS        row order, Slurm's keys (default P,t,-p: partition, state, priority highest
                         first; S with --start; SQUEUE_SORT sets the default); -KEY reverses
"""

_Getter = Callable[["JobInfo", float, "tzinfo | None"], str]

#: ``-o`` letters: header and value.
FIELDS: dict[str, tuple[str, _Getter]] = {
    "i": ("JOBID", lambda j, now, tz: job_label(j.job_id, j.array_job_id, j.array_task_id)),
    "A": ("JOBID", lambda j, now, tz: str(j.job_id)),
    "F": ("ARRAY_JOB_ID", lambda j, now, tz: str(j.array_job_id or j.job_id)),
    "K": ("ARRAY_TASK_ID", lambda j, now, tz: "N/A" if j.array_task_id is None else str(j.array_task_id)),
    "j": ("NAME", lambda j, now, tz: j.name),
    "t": ("ST", lambda j, now, tz: state_code(j.state)),
    "T": ("STATE", lambda j, now, tz: j.state),
    "M": ("TIME", lambda j, now, tz: format_elapsed(_elapsed(j, now))),
    "L": ("TIME_LEFT", lambda j, now, tz: _time_left(j, now)),
    "l": ("TIME_LIMIT", lambda j, now, tz: format_time_limit(j.time_limit_s)),
    "D": ("NODES", lambda j, now, tz: str(j.num_nodes)),
    "C": ("CPUS", lambda j, now, tz: str(j.num_cpus)),
    "m": ("MIN_MEMORY", lambda j, now, tz: format_memory(j.min_memory_mb or 0)),
    "b": ("TRES_PER_NODE", lambda j, now, tz: _tres_per_node(j)),
    "R": ("NODELIST(REASON)", lambda j, now, tz: _reason_list(j)),
    "r": ("REASON", lambda j, now, tz: j.reason or "None"),
    "u": ("USER", lambda j, now, tz: j.user),
    "a": ("ACCOUNT", lambda j, now, tz: j.account),
    "P": ("PARTITION", lambda j, now, tz: j.partition),
    "Q": ("PRIORITY", lambda j, now, tz: str(j.priority)),
    "S": ("START_TIME", lambda j, now, tz: format_timestamp(j.start_time, tz) if j.start_time else "N/A"),
    "V": ("SUBMIT_TIME", lambda j, now, tz: format_timestamp(j.submit_time, tz)),
    "N": ("NODELIST", lambda j, now, tz: j.node_list),
    "Z": ("WORK_DIR", lambda j, now, tz: j.workdir),
    "Y": ("SCHEDNODES", lambda j, now, tz: "(null)"),
    "E": ("DEPENDENCY", lambda j, now, tz: j.dependency or "(null)"),
    "q": ("QOS", lambda j, now, tz: j.qos or "normal"),
    "y": ("NICE", lambda j, now, tz: str(j.nice)),
}
#: Letters Slurm has that Corral does not print yet.
LATER_FIELDS = "BcdefgGhHIknoOpsUvwWxXz"

#: ``-O`` names (lower case) and the letter they print.
LONG_NAMES: dict[str, str] = {
    "jobid": "A", "jobarrayid": "i", "arrayjobid": "F", "arraytaskid": "K",
    "name": "j", "statecompact": "t", "state": "T", "timeused": "M", "timeleft": "L",
    "timelimit": "l", "numnodes": "D", "numcpus": "C", "minmemory": "m", "tres-per-node": "b",
    "reasonlist": "R", "reason": "r", "username": "u", "account": "a", "partition": "P",
    "priority": "Q", "starttime": "S", "submittime": "V", "nodelist": "N", "workdir": "Z",
    "schednodes": "Y", "dependency": "E", "qos": "q", "nice": "y",
}  # fmt: skip


class SqueueArgs(msgspec.Struct):
    """What an squeue command line asks for."""

    layout: Layout  # output format
    header: bool = True  # print the header line
    jobs: list[JobRef] = []  # -j
    users: list[str] = []  # -u
    me: bool = False  # --me
    partitions: list[str] = []  # -p
    states: list[str] = []  # -t (long names); empty: the live states
    all_states: bool = False  # -t all
    names: list[str] = []  # -n
    accounts: list[str] = []  # -A
    nodes: list[str] = []  # -w (expanded): only jobs with one of these nodes
    qos: list[str] = []  # -q
    pending_only: bool = False  # --start
    expand_arrays: bool = False  # -r: one row per array task
    sort: list[tuple[str, bool]] = []  # -S: (key, reversed), primary first
    help: bool = False  # --help / --usage
    version: bool = False  # --version

    @property
    def job_ids(self) -> list[int]:
        """The job and array ids of ``-j``."""
        return ids_of(self.jobs)


def parse_args(argv: Sequence[str], default_sort: str | None = None) -> SqueueArgs:
    """Parse squeue's command line (no IO); ``default_sort`` is ``SQUEUE_SORT``'s, if set."""
    args = OPTIONS.parse(argv)
    if args.positionals:
        raise CliError(f"unrecognized argument '{args.positionals[0]}'")
    long_format = args.last("Format")
    if long_format is not None:
        layout = parse_long_layout(long_format)
    else:
        default = (
            START_FORMAT if args.given("start") else LONG_FORMAT if args.given("long") else DEFAULT_FORMAT
        )
        layout = parse_layout(args.last("format") or default, "--format", FIELDS, LATER_FIELDS)
    states_items = args.items("states")
    all_states = any(item.lower() == "all" for item in states_items)
    return SqueueArgs(
        layout=layout,
        header=not args.given("noheader"),
        jobs=parse_job_refs(split_job_list(args.all("jobs")), "--jobs"),
        users=args.items("user"),
        me=args.given("me"),
        partitions=args.items("partition"),
        states=[] if all_states else parse_states(states_items, "--states"),
        all_states=all_states,
        names=args.items("name"),
        accounts=args.items("account"),
        nodes=_hosts(args.all("nodelist")),
        qos=args.items("qos"),
        pending_only=args.given("start"),
        expand_arrays=args.given("array"),
        sort=parse_sort(
            args.last("sort") or default_sort or (START_SORT if args.given("start") else DEFAULT_SORT)
        ),
        help=args.given("help") or args.given("usage"),
        version=args.given("version"),
    )


def _hosts(values: Sequence[str]) -> list[str]:
    """``-w`` values (hostlists) as node names; FormatError (printed as is) if one is malformed."""
    from corral.libs.slurm import hostlist

    return [name for value in values for name in hostlist.expand(value, "--nodelist")]


def _on_nodes(job: JobInfo, nodes: Sequence[str]) -> bool:
    """Whether the job holds any of these nodes (a pending job holds none)."""
    from corral.libs.slurm import hostlist

    return bool(job.node_list) and not set(hostlist.expand(job.node_list)).isdisjoint(nodes)


def parse_long_layout(text: str) -> Layout:
    """Parse ``-O``: ``Name[:[.][WIDTH][SUFFIX]],...``; widths default to 20, left-justified."""
    specs: list[FieldSpec] = []
    for item in (part for part in text.split(",") if part.strip()):
        name, _, size = item.strip().partition(":")
        letter = LONG_NAMES.get(name.lower())
        if letter is None:
            raise CliError(f'invalid --Format field "{name}": use one of {",".join(sorted(LONG_NAMES))}')
        right = size.startswith(".")
        digits = size.lstrip(".")
        width_text = digits[: len(digits) - len(digits.lstrip("0123456789"))]
        width = int(width_text) if width_text else DEFAULT_LONG_WIDTH
        specs.append(FieldSpec(letter, width, right, suffix=digits[len(width_text) :]))
    if not specs:
        raise CliError('invalid --Format "": name at least one field')
    return Layout("", tuple(specs))


def jobs_request(args: SqueueArgs, me: str) -> JobsRequest:
    """The ``jobs`` request for these arguments; ``me`` is the caller's user name."""
    from corral.schemas.api import JobsRequest

    users = [*args.users, me] if args.me else list(args.users)
    states = ["PENDING"] if args.pending_only else list(args.states)
    return JobsRequest(
        job_ids=args.job_ids,
        users=users,
        partitions=args.partitions,
        states=states,
        include_finished=bool(args.job_ids) or args.all_states or any(s in _TERMINAL for s in states),
        # An array's alike pending tasks as one row, which ``aggregate_arrays`` merges as it merges tasks:
        # not for -r (a row per task), -j (which may name one task) or -S -i (a row goes where its last task
        # would).
        collapse_arrays=not args.expand_arrays and not args.jobs and ("i", True) not in args.sort,
    )


def select_jobs(jobs: Sequence[JobInfo], args: SqueueArgs) -> list[JobInfo]:
    """The jobs to show: the filters the ``jobs`` verb does not apply (names, accounts, --start, tasks)."""
    return [
        job
        for job in jobs
        if (not args.names or job.name in args.names)
        and (not args.accounts or job.account in args.accounts)
        and (not args.nodes or _on_nodes(job, args.nodes))
        and (not args.qos or job.qos in args.qos)
        and (not args.pending_only or job.state == "PENDING")
        and named(args.jobs, job.job_id, job.array_job_id, job.array_task_id)
    ]


def aggregate_arrays(jobs: Sequence[JobInfo]) -> tuple[list[JobInfo], dict[int, str]]:
    """Slurm's view of arrays: the pending tasks of an array that never ran, with the same reason, are one
    row ``A_[x-y%P]`` (shown with the lowest task's fields) where the first of them was.

    Returns the rows and the ``%i`` label of each aggregated row by its job id.
    """

    def group(job: JobInfo) -> tuple[int | None, str] | None:
        never_ran = job.state == "PENDING" and job.restart_count == 0
        return (job.array_job_id, job.reason) if never_ran else None

    return pending_array_rows(
        jobs, group, lambda job: job.array_throttle, lambda job: job.array_tasks or (job.array_task_id or 0,)
    )


def render_jobs(
    jobs: Sequence[JobInfo],
    layout: Layout,
    *,
    header: bool,
    now: float,
    tz: tzinfo | None = None,
    labels: Mapping[int, str] | None = None,
) -> list[str]:
    """The output lines for ``jobs`` in ``layout`` at time ``now`` (timestamps in ``tz``, default local).

    ``labels`` replaces the ``%i`` of some rows (aggregated array tasks, by job id).
    """
    getters = [FIELDS[spec.key][1] for spec in layout.fields]
    titles = [FIELDS[spec.key][0] for spec in layout.fields]
    shown = labels or {}
    rows = [
        [
            shown.get(job.job_id) or get(job, now, tz) if spec.key == "i" else get(job, now, tz)
            for spec, get in zip(layout.fields, getters, strict=True)
        ]
        for job in jobs
    ]
    return render_layout(layout, titles, rows, header=header)


def _elapsed(job: JobInfo, now: float) -> int:
    if job.start_time is None:
        return 0
    end = job.end_time if job.end_time is not None else now
    return max(0, int(end - job.start_time))


def _time_left(job: JobInfo, now: float) -> str:
    if job.time_limit_s is None:
        return "UNLIMITED"
    return format_elapsed(max(0, job.time_limit_s - _elapsed(job, now)))


def _tres_per_node(job: JobInfo) -> str:
    if job.gpus_per_node <= 0:
        return "N/A"
    kind = f"gpu:{job.gpu_type}" if job.gpu_type else "gpu"
    return f"gres:{kind}:{job.gpus_per_node}"  # Slurm 22.05 squeue: gres:gpu:2


def _reason_list(job: JobInfo) -> str:
    """Slurm's ``%R``: ``(Reason)`` while pending or after a failure, else the nodes."""
    reason = job.reason if job.reason and job.reason != "None" else ""
    if job.state == "PENDING":
        return f"({reason or 'None'})"
    if job.state in _TERMINAL and reason:
        return f"({reason})"
    return job.node_list


def output(found: Sequence[JobInfo], args: SqueueArgs, now: float, tz: tzinfo | None = None) -> list[str]:
    """squeue's lines for the jobs the ``jobs`` verb ``found`` for ``args``."""
    jobs = sort_jobs(select_jobs(found, args), args.sort, now)
    if len(args.jobs) == 1 and not jobs:
        raise CliError("Invalid job id specified")
    rows, labels = (jobs, {}) if args.expand_arrays else aggregate_arrays(jobs)
    return render_jobs(rows, args.layout, header=args.header, now=now, tz=tz, labels=labels)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``squeue``."""
    return run_command(COMMAND, _squeue, argv)


def _squeue(argv: list[str]) -> int:
    args = parse_args(argv, os.environ.get("SQUEUE_SORT") or None)
    if args.help or args.version:
        sys.stdout.write(USAGE if args.help else version_text() + "\n")
        return 0
    from corral.cli.client import find_cluster

    cluster = find_cluster()
    lines = output(cluster.jobs(jobs_request(args, cluster.user)), args, time.time())
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
