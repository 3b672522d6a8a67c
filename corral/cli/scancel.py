"""``scancel``: cancel or signal jobs by id, or the jobs matching filters (``--me -u -n -t -p -A -q -w``).

Without ``-s``, or with ``-s KILL`` and neither ``-b`` nor ``-f``, the jobs are cancelled (SIGTERM, SIGKILL
after KillWait). Any other signal is delivered to the running jobs without changing their state, as in
Slurm: to the tasks of the job's steps (srun), to the batch shell only with ``-b/--batch``, or to the batch
shell, what it started and the steps' tasks with ``-f/--full`` (the ``signal`` verb). Filters with a signal
select only running jobs (a pending job has nothing to signal).

Ids are ``N`` (a job, or every task of the array whose id it is), ``A_T`` (one array task) or ``A_[1-3]``
(some tasks); the tasks go to the gateway by index.

Filters resolve to job ids through the ``jobs`` verb first, then ``cancel`` requests carry the ids, up to
``jobrefs.CONTROL_BATCH`` jobs each (``scancel -u`` of tens of thousands of jobs sends several).
Ids and filters together cancel the given jobs that match. Each job that could not be cancelled gets its
own ``Kill job error`` line and the exit status is then 1. Without ids and without ``-u``/``--me``,
filters apply to the caller's own jobs.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from corral.cli.errors import EXIT_FAILURE, CliError, error_line, run_command
from corral.cli.fields import parse_states
from corral.cli.jobrefs import JobRef, batches, ids_of, job_label, named, parse_job_refs, split_refs
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported, version_text
from corral.libs.slurm import hostlist
from corral.libs.slurm.errors import FormatError
from corral.libs.slurm.signals import parse_signal_name

if TYPE_CHECKING:
    from corral.schemas.api import (
        CancelReply,
        CancelRequest,
        ControlReply,
        JobInfo,
        JobsRequest,
        SignalRequest,
    )
    from corral.schemas.events import SignalScope

COMMAND = "scancel"
#: The signal that cancels the job (without -b/-f), as in Slurm.
SIGKILL = 9

OPTIONS = OptionTable(
    [
        flag("me"),
        Opt("user", "u"),
        Opt("name", "n", aliases=("jobname",)),
        Opt("state", "t"),
        Opt("partition", "p"),
        Opt("account", "A"),
        Opt("signal", "s"),
        Opt("qos", "q"),
        Opt("nodelist", "w"),
        flag("batch", "b"),
        flag("full", "f"),
        flag("quiet", "Q"),
        flag("help"),
        flag("usage"),
        flag("version", "V"),
        *unsupported("interactive/i verbose/v reservation/R hurry/H clusters/M wckey sibling cron/c ctld"),
    ]
)

USAGE = """\
Usage: scancel [OPTIONS...] [JOB_ID...]
      --me               my jobs                  -u, --user=USER       this user's jobs
  -n, --name=NAME        jobs with this name      -t, --state=STATES    PENDING,RUNNING (or PD,R)
  -p, --partition=NAMES  jobs in these partitions -A, --account=NAMES
  -q, --qos=NAMES        jobs of these QOS        -w, --nodelist=HOSTS  jobs running on these nodes
  -s, --signal=SIG       send SIG (name or number) to the running jobs' steps instead of cancelling
                         (KILL cancels)
  -b, --batch            signal only the batch shell  -f, --full    the batch shell and the steps
"""


class ScancelArgs(msgspec.Struct):
    """What an scancel command line asks for."""

    jobs: list[JobRef] = []  # positional ids
    users: list[str] = []  # -u
    me: bool = False  # --me
    names: list[str] = []  # -n
    states: list[str] = []  # -t (long names)
    partitions: list[str] = []  # -p
    accounts: list[str] = []  # -A
    qos: list[str] = []  # -q
    nodes: list[str] = []  # -w (expanded)
    signal: int | None = None  # -s; None: cancel
    scope: SignalScope = "steps"  # -b: batch, -f: full
    help: str | None = None  # text to print instead (--help, --version)

    @property
    def job_ids(self) -> list[int]:
        """The job and array ids given."""
        return ids_of(self.jobs)

    @property
    def filtered(self) -> bool:
        """True if any filter was given, so ids come from the ``jobs`` verb."""
        return bool(
            self.users or self.me or self.names or self.states or self.partitions or self.accounts
        ) or bool(self.qos or self.nodes)

    @property
    def signals(self) -> bool:
        """True if the jobs are signalled rather than cancelled."""
        if self.signal is None:
            return self.scope != "steps"
        return self.signal != SIGKILL or self.scope != "steps"


def parse_args(argv: Sequence[str]) -> ScancelArgs:
    """Parse scancel's command line (ids and options in any order; no IO)."""
    args = OPTIONS.parse(argv)
    help_text = None
    if args.given("help") or args.given("usage"):
        help_text = USAGE
    elif args.given("version"):
        help_text = version_text() + "\n"
    parsed = ScancelArgs(
        jobs=parse_job_refs(args.positionals, "job id"),
        users=args.items("user"),
        me=args.given("me"),
        names=args.items("name"),
        states=parse_states(args.items("state"), "--state"),
        partitions=args.items("partition"),
        accounts=args.items("account"),
        qos=args.items("qos"),
        nodes=_nodes(args.items("nodelist")),
        signal=_signal(args.last("signal")),
        scope="full" if args.given("full") else "batch" if args.given("batch") else "steps",
        help=help_text,
    )
    if help_text is None and not parsed.jobs and not parsed.filtered:
        raise CliError("No job identification provided")
    return parsed


def _signal(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_signal_name(text, "--signal")
    except FormatError:
        raise CliError(f"Invalid job signal: {text}") from None


def _nodes(lists: list[str]) -> list[str]:
    """The node names of ``-w`` host lists."""
    try:
        return [name for text in lists for name in hostlist.expand(text)]
    except FormatError as exc:
        raise CliError(f"invalid --nodelist: {exc}") from None


def jobs_request(args: ScancelArgs, me: str) -> JobsRequest:
    """The ``jobs`` request that resolves the filters; without ids or users, the caller's jobs."""
    from corral.schemas.api import JobsRequest

    users = [*args.users, me] if args.me else list(args.users)
    if not users and not args.job_ids:
        users = [me]
    # A pending job has nothing to signal: with a signal, only running jobs are selected.
    states = ["RUNNING"] if args.signals else args.states
    return JobsRequest(job_ids=args.job_ids, users=users, partitions=args.partitions, states=states)


def select_refs(jobs: Sequence[JobInfo], args: ScancelArgs) -> list[JobRef]:
    """The jobs that also pass the filters the ``jobs`` verb does not apply (names, accounts, tasks).

    Array tasks are named by index (``A_T``), which the gateway maps to the task without searching.
    """
    return [
        JobRef(job.job_id) if job.array_task_id is None else JobRef(job.array_job_id, (job.array_task_id,))
        for job in jobs
        if (not args.names or job.name in args.names)
        and (not args.accounts or job.account in args.accounts)
        and (not args.states or job.state in args.states)
        and (not args.qos or job.qos in args.qos)
        and (not args.nodes or bool(set(args.nodes) & set(_job_nodes(job))))
        and named(args.jobs, job.job_id, job.array_job_id, job.array_task_id)
    ]


def whole_arrays(refs: list[JobRef], jobs: Sequence[JobInfo], args: ScancelArgs) -> list[JobRef]:
    """The references with every task of an array that ``jobs`` holds replaced by one to the array itself:
    one whole-array cancel (one entry in the log, as ``scancel A``) instead of one per task (a sweep's
    ``scancel -u`` of 50 arrays of 1,001 tasks was 50,050 lookups and appends, 13.5 s). Only for a cancel
    whose ``jobs`` hold every live job of the users: no ids, states or partitions were asked of them."""
    if args.jobs or args.states or args.partitions or args.signals:
        return refs
    live = Counter(job.array_job_id for job in jobs if job.array_task_id is not None)
    chosen = Counter(ref.job_id for ref in refs if ref.tasks is not None)
    whole = {array for array, count in chosen.items() if count == live[array]}
    out: list[JobRef] = []
    sent: set[int] = set()
    for ref in refs:
        if ref.tasks is None or ref.job_id not in whole:
            out.append(ref)
        elif ref.job_id not in sent:  # the array once, where its first task was
            out.append(JobRef(ref.job_id))
            sent.add(ref.job_id)
    return out


def _job_nodes(job: JobInfo) -> list[str]:
    return hostlist.expand(job.node_list) if job.node_list else []


def signal_request(refs: Sequence[JobRef], args: ScancelArgs) -> SignalRequest:
    """One signal request for every job, array and array task named."""
    from corral.schemas.api import SignalRequest

    job_ids, tasks = split_refs(refs)
    signum = SIGKILL if args.signal is None else args.signal
    return SignalRequest(job_ids=job_ids, tasks=tasks, signal=signum, scope=args.scope)


def cancel_request(refs: Sequence[JobRef]) -> CancelRequest:
    """One request for every job, array and array task named."""
    from corral.schemas.api import CancelRequest

    job_ids, tasks = split_refs(refs)
    return CancelRequest(job_ids=job_ids, tasks=tasks)


def failure_lines(reply: CancelReply | ControlReply) -> list[str]:
    """One ``Kill job error`` line per job that could not be cancelled (``A_T`` for an array task)."""
    return [
        error_line(
            COMMAND,
            f"Kill job error on job id {job_label(outcome.job_id, outcome.job_id, outcome.array_task_id)}: "
            f"{outcome.error}",
        )
        for outcome in reply.outcomes
        if outcome.error is not None
    ]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scancel``."""
    return run_command(COMMAND, _scancel, argv)


def _scancel(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.help is not None:
        sys.stdout.write(args.help)
        return 0
    from corral.cli.client import find_cluster
    from corral.schemas.api import CancelReply, ControlReply

    cluster = find_cluster()
    refs = args.jobs
    if args.filtered:
        jobs = cluster.jobs(jobs_request(args, cluster.user))
        refs = whole_arrays(select_refs(jobs, args), jobs, args)
    if not refs:
        return 0
    failures = []
    for batch in batches(refs):  # thousands of jobs (-u of a sweep's user) in several requests
        reply: CancelReply | ControlReply
        if args.signals:
            reply = cluster.call("signal", signal_request(batch, args), ControlReply)
        else:
            reply = cluster.call("cancel", cancel_request(batch), CancelReply)
        failures += failure_lines(reply)
    for line in failures:
        print(line, file=sys.stderr)
    return EXIT_FAILURE if failures else 0


if __name__ == "__main__":
    sys.exit(main())
