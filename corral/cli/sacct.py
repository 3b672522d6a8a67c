"""``sacct``: accounting records of jobs and their steps, fixed-width or ``-P``/``-p`` parsable.

Rendering is a pure function: ``render_acct(jobs, columns, ...)``; ``main`` parses, calls the ``acct``
verb and prints. Fixed-width output is Slurm's: a header, a line of dashes, every field followed by one
space, JobID left-justified and the rest right-justified, values too long cut with a ``+``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import TYPE_CHECKING

import msgspec

from corral.cli.errors import CliError, run_command
from corral.cli.fields import parse_states
from corral.cli.jobrefs import JobRef, ids_of, named, parse_job_refs, split_job_list
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported, version_text
from corral.cli.sacct_fields import (
    COLUMNS,
    LATER_COLUMNS,
    Column,
    RowContext,
    job_rows,
    parse_time_point,
    records,
)
from corral.libs.slurm.array import pending_array_rows

if TYPE_CHECKING:
    from corral.schemas.api import AcctJob, AcctRequest

COMMAND = "sacct"
DEFAULT_FIELDS = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode"
BRIEF_FIELDS = "JobID,State,ExitCode"
#: Slurm's ``--long`` fields that Corral records (its usage statistics, MaxRSS and the like, it does not).
LONG_FIELDS = "JobID,JobIDRaw,JobName,Partition,NTasks,AllocCPUS,Elapsed,State,ExitCode"

OPTIONS = OptionTable(
    [
        Opt("jobs", "j"),
        Opt("format", "o"),
        flag("brief", "b"),
        flag("long", "l"),
        flag("json"),
        flag("parsable2", "P"),
        flag("parsable", "p"),
        Opt("delimiter"),
        flag("noheader", "n"),
        flag("allocations", "X"),
        flag("duplicates", "D"),
        flag("array"),
        Opt("user", "u"),
        flag("allusers", "a"),
        Opt("accounts", "A"),
        Opt("partition", "r"),
        Opt("name"),
        Opt("state", "s"),
        Opt("starttime", "S"),
        Opt("endtime", "E"),
        flag("helpformat", "e"),
        flag("help", "h"),
        flag("usage"),
        flag("version", "V"),
        *unsupported(
            "yaml allclusters/L clusters/M nodelist/N qos/q truncate/T "
            "timelimit-min/k timelimit-max/K nnodes/i ncpus/I wckeys/W associations/x gid/g group file/f "
            "completion/c noconvert units batch-script/B env-vars verbose/v whole-hetjob local "
            "federation uid reason/R constraints/C fedr expand-patterns"
        ),
    ]
)

USAGE = """\
Usage: sacct [OPTIONS...]
  -j, --jobs=IDS          only these jobs (repeatable, comma lists; A: every task of array A, A_T: one)
  -o, --format=FIELDS     JobID,JobName,State,...; a width as JobName%30 (-e lists the fields)
  -b, --brief             JobID,State,ExitCode     -X, --allocations  no step rows
  -P, --parsable2         fields separated by |    -p, --parsable     ... with a trailing |
      --delimiter=TEXT    separator for -p/-P      -n, --noheader     no header
  -u, --user=USERS        these users' jobs        -a, --allusers     everyone's jobs (default: mine)
  -A, --accounts=NAMES    -r, --partition=NAMES    --name=NAMES      -s, --state=STATES
  -S, --starttime=TIME    -E, --endtime=TIME       (YYYY-MM-DD[THH:MM[:SS]], now, now-2days, today)
  -D, --duplicates        every run of a requeued job, each a record with its steps (REQUEUED, NODE_FAIL, ...)
      --array             a row per array task (without it the tasks that never started are one, A_[0-3])
  -l, --long              Slurm's long field list (the fields Corral records)
      --json              the jobs as Slurm's JSON (jobs[].job_id, name, state.current, exit_code, steps)
"""


class SacctArgs(msgspec.Struct):
    """What an sacct command line asks for."""

    columns: list[Column]  # output fields with their widths
    header: bool = True  # -n turns it off
    parsable: str | None = None  # None: fixed width; "P": --parsable2; "p": --parsable
    delimiter: str = "|"  # --delimiter
    steps: bool = True  # -X turns step rows off
    duplicates: bool = False  # -D: every run of a requeued job
    array: bool = False  # --array: a row per array task, the pending ones too
    jobs: list[JobRef] = []  # -j (an array's id: every task; A_T: one task)
    users: list[str] = []  # -u
    all_users: bool = False  # -a
    accounts: list[str] = []  # -A
    partitions: list[str] = []  # -r
    names: list[str] = []  # --name
    states: list[str] = []  # -s
    start: str | None = None  # -S as given
    end: str | None = None  # -E as given
    help: str | None = None  # text to print instead of querying (--help, -e, --version)
    json: bool = False  # --json: Slurm's JSON document instead of columns

    @property
    def job_ids(self) -> list[int]:
        """The job and array ids of ``-j``."""
        return ids_of(self.jobs)


def parse_args(argv: Sequence[str]) -> SacctArgs:
    """Parse sacct's command line (no IO)."""
    args = OPTIONS.parse(argv)
    if args.positionals:
        raise CliError(f"unrecognized argument '{args.positionals[0]}'")
    default = LONG_FIELDS if args.given("long") else BRIEF_FIELDS if args.given("brief") else DEFAULT_FIELDS
    formats = args.all("format") or [default]
    parsable = "P" if args.given("parsable2") else "p" if args.given("parsable") else None
    help_text = None
    if args.given("help") or args.given("usage"):
        help_text = USAGE
    elif args.given("helpformat"):
        help_text = " ".join(column.title for column in COLUMNS.values()) + "\n"
    elif args.given("version"):
        help_text = version_text() + "\n"
    return SacctArgs(
        columns=parse_columns(",".join(formats)),
        header=not args.given("noheader"),
        parsable=parsable,
        delimiter=args.last("delimiter", "|") or "|",
        steps=not args.given("allocations"),
        duplicates=args.given("duplicates"),
        array=args.given("array"),
        jobs=parse_job_refs(split_job_list(args.all("jobs")), "--jobs"),
        users=args.items("user"),
        all_users=args.given("allusers"),
        accounts=args.items("accounts"),
        partitions=args.items("partition"),
        names=args.items("name"),
        states=parse_states(args.items("state"), "--state"),
        start=args.last("starttime"),
        end=args.last("endtime"),
        help=help_text,
        json=args.given("json"),
    )


def parse_columns(text: str) -> list[Column]:
    """Parse ``-o``: names in any case, comma or space separated, each with an optional ``%WIDTH``."""
    columns: list[Column] = []
    for item in text.replace(" ", ",").split(","):
        if not item:
            continue
        name, percent, width = item.partition("%")
        column = COLUMNS.get(name.lower())
        if column is None:
            if name.lower() in LATER_COLUMNS:
                raise CliError(f"sacct field {name} is not supported by Corral yet")
            raise CliError(f'Invalid field requested: "{name}"')
        if percent:
            if not width.isdigit() or not 0 < int(width) <= 10000:
                raise CliError(f'invalid --format field "{item}": give a width as {column.title}%30')
            column = column.resized(int(width))
        columns.append(column)
    if not columns:
        raise CliError('invalid --format "": name at least one field')
    return columns


def acct_request(args: SacctArgs, me: str, now: float, tz: tzinfo | None = None) -> AcctRequest:
    """The ``acct`` request: without ``-j``, ``-u`` or ``-a``, only the caller's jobs."""
    from corral.schemas.api import AcctRequest

    if args.users:
        users = args.users
    elif args.all_users or args.job_ids:
        users = []
    else:
        users = [me]
    return AcctRequest(
        job_ids=args.job_ids,
        users=users,
        accounts=args.accounts,
        states=args.states,
        start_after=None if args.start is None else parse_time_point(args.start, "--starttime", now, tz),
        end_before=None if args.end is None else parse_time_point(args.end, "--endtime", now, tz),
        duplicates=args.duplicates,
    )


def select_jobs(jobs: Sequence[AcctJob], args: SacctArgs) -> list[AcctJob]:
    """The filters the ``acct`` verb does not apply: partitions, names and array tasks (``-j A_T``)."""
    return [
        job
        for job in jobs
        if (not args.partitions or job.partition in args.partitions)
        and (not args.names or job.name in args.names)
        and named(args.jobs, job.job_id, job.array_job_id, job.array_task_id)
    ]


def pending_arrays(jobs: Sequence[AcctJob]) -> tuple[list[AcctJob], dict[int, str]]:
    """Slurm's record of a pending array: the tasks that never started are one row ``A_[0-3]`` until they
    start (each task that started is a row of its own)."""

    def group(job: AcctJob) -> int | None:
        never_ran = job.state == "PENDING" and job.start_time is None and job.restart_count == 0
        return job.array_job_id if never_ran else None

    return pending_array_rows(jobs, group)


def render_acct(
    jobs: Sequence[AcctJob],
    columns: Sequence[Column],
    *,
    header: bool = True,
    parsable: str | None = None,
    delimiter: str = "|",
    steps: bool = True,
    array: bool = False,
    now: float,
    tz: tzinfo | None = None,
    uid_of: Callable[[str], str] = str,
) -> list[str]:
    """The output lines: header (unless ``header`` is False), then each job's row and its steps' rows.

    ``parsable`` is None (fixed width), ``"P"`` (``--parsable2``) or ``"p"`` (``--parsable``);
    ``uid_of`` maps a user name to what ``CANCELLED by`` shows.
    """
    jobs, labels = (list(jobs), {}) if array else pending_arrays(jobs)
    context = RowContext(now=now, tz=tz, uid_of=uid_of, labels=labels)
    rows = [
        row for job in jobs for record in records(job) for row in job_rows(record, columns, context, steps)
    ]
    titles = [column.title for column in columns]
    if parsable is not None:
        end = delimiter if parsable == "p" else ""
        lines = [delimiter.join(values) + end for values in ([titles] if header else []) + rows]
        return lines
    lines = []
    if header:
        lines.append(
            "".join(_cell(title, column, cut="") for title, column in zip(titles, columns, strict=True))
        )
        lines.append("".join("-" * column.width + " " for column in columns))
    for values in rows:
        lines.append("".join(_cell(value, column) for value, column in zip(values, columns, strict=True)))
    return lines


def _cell(value: str, column: Column, cut: str = "+") -> str:
    """One fixed-width field and its trailing space; a value too long keeps its start and ends in ``+``."""
    width = column.width
    if len(value) > width:
        value = value[: width - len(cut)] + cut
    return (value.rjust(width) if column.right else value.ljust(width)) + " "


def local_uid(user: str) -> str:
    """The numeric uid of a local user, as ``CANCELLED by`` shows it; the name if there is no such user."""
    import pwd

    try:
        return str(pwd.getpwnam(user).pw_uid)
    except KeyError:
        return user


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sacct``."""
    return run_command(COMMAND, _sacct, argv)


def _sacct(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.help is not None:
        sys.stdout.write(args.help)
        return 0
    from corral.cli.client import find_cluster

    now = time.time()
    cluster = find_cluster()
    found = cluster.acct(acct_request(args, cluster.user, now), every=True)
    if args.json:
        from corral.cli.sacct_json import acct_json

        sys.stdout.write(acct_json(select_jobs(found, args), now, args.steps) + "\n")
        return 0
    lines = render_acct(
        select_jobs(found, args),
        args.columns,
        header=args.header,
        parsable=args.parsable,
        delimiter=args.delimiter,
        steps=args.steps,
        array=args.array,
        now=now,
        uid_of=local_uid,
    )
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
