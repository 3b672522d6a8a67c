"""``scontrol``: ``hold``, ``release``, ``update JobId=``, ``show job`` and ``show hostnames``/``hostlist``.

- ``scontrol hold ID[,ID...] [ID...]`` and ``scontrol release ...`` go to the gateway (verbs ``hold`` and
  ``release``; an array's id means every task, ``A_T``/``A_[1-3]`` some tasks); each job that could not
  be held or released gets its own ``scontrol: error: <why> for job <id>`` line and the exit status is
  then 1;
- ``scontrol update JobId=ID [TimeLimit=TIME] [Partition=NAME] [Priority=N]`` changes a pending job (verb
  ``update``; a user may only lower a time limit, only an admin sets a priority, and ``Priority=0`` holds
  the job, as in Slurm);
- ``scontrol show job [ID]`` prints Slurm's multi-line ``Key=Value`` record of each job (``-o``: one line
  each) from the scheduler's ``jobs`` verb; ``show hostnames [LIST]`` and ``show hostlist LIST`` expand and
  compress host lists locally (``LIST`` defaults to ``SLURM_JOB_NODELIST``);
- ``scontrol create reservation ...``, ``delete ReservationName=X`` and ``show reservation[s] [X]``:
  advance reservations (``scontrol_resv.py``);
- ``scontrol update NodeName=LIST State=DRAIN Reason=TEXT|RESUME`` (admins) and ``show node``:
  ``scontrol_nodes.py``;
- the other commands of Slurm's scontrol are refused by name as not supported by Corral yet.

Commands and ``show`` entities are case-insensitive, as in Slurm. Rendering is pure: ``show_job``.
"""

from __future__ import annotations

import os
import posixpath
import signal
import sys
import time
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import TYPE_CHECKING

from corral.cli import scontrol_nodes, scontrol_resv
from corral.cli.errors import EXIT_FAILURE, CliError, error_line, run_command
from corral.cli.jobrefs import JobRef, ids_of, job_label, named, parse_job_refs, split_job_list, split_refs
from corral.cli.options import OptionTable, flag, parse_job_ids, unsupported, version_text
from corral.libs.core.reasons import INELIGIBLE
from corral.libs.slurm import hostlist
from corral.libs.slurm.memory import format_memory
from corral.libs.slurm.timefmt import format_elapsed_sacct, format_timestamp, parse_time_limit

if TYPE_CHECKING:
    from corral.schemas.api import ControlReply, JobInfo, UpdateRequest

COMMAND = "scontrol"

OPTIONS = OptionTable(
    [
        flag("oneliner", "o"),
        flag("quiet", "Q"),
        flag("details", "d"),
        flag("all", "a"),
        flag("help", "h"),
        flag("usage"),
        flag("version", "V"),
        *unsupported("clusters/M federation local sibling json yaml verbose/v hide"),
    ]
)

USAGE = """\
Usage: scontrol [OPTIONS...] COMMAND [ARGS...]
  hold JOBID[,JOBID...]       keep pending jobs from starting (JobHeldUser)
  release JOBID[,JOBID...]    let held jobs start again
  requeue JOBID[,JOBID...]    kill running jobs and queue them again (same id, SLURM_RESTART_COUNT + 1)
  requeuehold JOBID[,...]     requeue, held until released (a pending job is just held)
  update JobId=ID [TimeLimit=TIME] [Partition=NAME] [Priority=N]   change a pending job
  update NodeName=LIST State=DRAIN Reason=TEXT | State=RESUME     drain or resume nodes (admins)
  show job [JOBID]            every field of a job (all live jobs without JOBID)
  create reservation ReservationName=X StartTime=now Duration=1:00:00 Nodes=LIST|NodeCnt=N|TRES=gres/gpu=N
                   Users=a,b [Accounts=c] [PartitionName=p] [Flags=MAINT,IGNORE_JOBS]   (admins)
  delete ReservationName=X    delete a reservation (admins)
  show reservation [NAME]     every field of a reservation (all without NAME)
  show node [NAME]            every field of a node (all without NAME)
  show partition [NAME]       every field of a partition (all without NAME)
  show hostnames [LIST]       one host per line (LIST defaults to SLURM_JOB_NODELIST)
  show hostlist HOSTS         the compressed host list of comma-separated HOSTS
  -o, --oneliner              one line per record
"""

#: Slurm's scontrol commands that Corral does not implement yet.
LATER_COMMANDS = frozenset(
    {
        "uhold", "suspend", "resume", "top", "notify", "reboot",
        "reconfigure", "listpids", "ping", "shutdown", "takeover", "token", "wait_job",
        "write", "setdebug", "setdebugflags", "fsdampeningfactor", "cancel_reboot", "errnumstr",
        "getaddrs", "pidinfo", "power", "schedloglevel", "version",
    }
)  # fmt: skip
#: Slurm's ``show`` entities that Corral does not implement yet.
LATER_ENTITIES = frozenset(
    {
        "config", "step",
        "steps", "assoc_mgr", "burstbuffer", "daemons", "federation", "frontend", "licenses", "topology",
        "aliases", "dwstat", "bbstat", "hostlistsorted",
    }
)  # fmt: skip

#: Resolves a user name to ``(uid, group name, gid)``; None if the machine does not know it.
UserLookup = Callable[[str], "tuple[int, str, int] | None"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``scontrol``."""
    return run_command(COMMAND, _scontrol, argv)


def _scontrol(argv: list[str]) -> int:
    args = OPTIONS.parse(argv, stop_at_positional=True)
    if args.given("help") or args.given("usage"):
        sys.stdout.write(USAGE)
        return 0
    if args.given("version"):
        print(version_text())
        return 0
    words = args.positionals + args.rest
    if not words:
        raise CliError("no command given: use hold, release or show (scontrol --help)")
    command, rest = words[0].lower(), words[1:]
    if command in ("hold", "release", "requeue", "requeuehold"):
        return _control(command, rest)
    if command == "show":
        return _show(rest, oneliner=args.given("oneliner"))
    if command == "update":
        return _update(rest)
    if command == "create":
        return scontrol_resv.create(rest)
    if command == "delete":
        return scontrol_resv.delete(rest)
    if command in LATER_COMMANDS:
        raise CliError(f"scontrol {command} is not supported by Corral yet")
    raise CliError(f"invalid keyword: {words[0]}")


def control_ids(words: Sequence[str], command: str) -> list[JobRef]:
    """The jobs of ``hold``/``release`` (space- or comma-separated; ``JobId=`` accepted; ``A_T`` too)."""
    items: list[str] = []
    for word in words:
        key, eq, value = word.partition("=")
        if eq and key.lower() in ("jobid", "job"):
            word = value
        elif eq:
            raise CliError(f"scontrol {command} {word}: only job ids are supported by Corral yet")
        items.extend(split_job_list([word]))
    if not items:
        raise CliError(f"scontrol {command} needs a job id")
    return parse_job_refs(items, "job id")


def failure_lines(reply: ControlReply) -> list[str]:
    """One ``scontrol: error: <why> for job <id>`` line per job that was refused."""
    return [
        error_line(COMMAND, f"{outcome.error} for job {_label(outcome.job_id, outcome.array_task_id)}")
        for outcome in reply.outcomes
        if outcome.error is not None
    ]


def _label(job_id: int, task: int | None) -> str:
    """A job as an outcome names it: ``A_T`` for an array task named by index."""
    return job_label(job_id, job_id, task)


def _control(command: str, words: Sequence[str]) -> int:
    from corral.cli.client import find_cluster
    from corral.schemas.api import ControlReply, HoldRequest, ReleaseRequest, RequeueRequest

    ids, tasks = split_refs(control_ids(words, command))
    request: HoldRequest | ReleaseRequest | RequeueRequest = HoldRequest(job_ids=ids, tasks=tasks)
    verb = command
    if command == "release":
        request = ReleaseRequest(job_ids=ids, tasks=tasks)
    elif command.startswith("requeue"):
        request, verb = RequeueRequest(job_ids=ids, tasks=tasks, hold=command == "requeuehold"), "requeue"
        # A job usually requeues itself, and the requeue's kill sequence (SIGCONT+SIGTERM to every process
        # of the job, scontrol included) can arrive before this process has exited: a requeue that was
        # accepted must still be reported as such (exit 0), so SIGTERM waits until scontrol is done (the
        # KillWait SIGKILL still ends it). Slurm's scontrol, in C, exits before its kill arrives.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    return _report(find_cluster().call(verb, request, ControlReply))


def _report(reply: ControlReply) -> int:
    """Print the refusals of a hold, release or update reply; the exit status."""
    failures = failure_lines(reply)
    for line in failures:
        print(line, file=sys.stderr)
    return EXIT_FAILURE if failures else 0


def update_request(words: Sequence[str]) -> UpdateRequest:
    """The request of ``scontrol update JobId=ID TimeLimit=... Partition=... Priority=...`` (any case)."""
    from corral.schemas.api import UpdateRequest

    values: dict[str, str] = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            raise CliError(
                f"scontrol update {word}: use KEY=VALUE (JobId=, TimeLimit=, Partition=, Priority=)"
            )
        name = key.lower()
        if name in ("partitionname", "reservationname", "frontendname", "stepid"):
            raise CliError(f"scontrol update {key}= is not supported by Corral yet")
        if name not in ("jobid", "timelimit", "partition", "priority"):
            raise CliError(f"scontrol update: changing {key} is not supported by Corral yet")
        values[name] = value
    if "jobid" not in values:
        raise CliError("scontrol update needs JobId=ID")
    ids = parse_job_ids(values["jobid"].split(","), "JobId")
    if len(ids) != 1:
        raise CliError("scontrol update of several jobs at once is not supported by Corral yet")
    limit_text = values.get("timelimit")
    time_limit = None
    if limit_text is not None:
        if limit_text[:1] in "+-" or limit_text.lower() in ("unlimited", "infinite", "-1"):
            raise CliError(f"TimeLimit={limit_text} is not supported by Corral yet: give a time")
        time_limit = parse_time_limit(limit_text, "TimeLimit")
        if time_limit is None:
            raise CliError(f"TimeLimit={limit_text} is not supported by Corral yet: give a time")
    partition = values.get("partition")
    if partition is not None and (not partition or "," in partition):
        raise CliError(f"Partition={partition}: give one partition name")
    priority = _priority(values.get("priority"))
    if time_limit is None and partition is None and priority is None:
        raise CliError("scontrol update: give TimeLimit=, Partition= or Priority= to change")
    return UpdateRequest(job_id=ids[0], time_limit_s=time_limit, partition=partition, priority=priority)


def _priority(text: str | None) -> int | None:
    """The value of ``Priority=`` (a whole number >= 0), None when not given."""
    if text is None:
        return None
    if not text.isdigit():
        raise CliError(f"Priority={text}: give a whole number >= 0 (0 holds the job)")
    return int(text)


def _update(words: Sequence[str]) -> int:
    from corral.cli.client import find_cluster
    from corral.schemas.api import ControlReply

    # As in Slurm, the key naming the record says what is updated: a node, or else a job.
    if any(word.partition("=")[0].lower() in ("nodename", "node") for word in words):
        return scontrol_nodes.update(words)
    return _report(find_cluster().call("update", update_request(words), ControlReply))


def _show(words: Sequence[str], *, oneliner: bool) -> int:
    if not words:
        raise CliError("scontrol show needs an entity: job, hostnames or hostlist")
    entity, rest = words[0].lower(), list(words[1:])
    if entity in ("job", "jobs", "jobid"):
        return _show_jobs(rest, oneliner)
    if entity in ("node", "nodes", "partition", "partitions"):
        return scontrol_nodes.show(entity.rstrip("s"), rest, oneliner)
    if entity in ("reservation", "reservations", "res"):
        return scontrol_resv.show(rest, oneliner)
    if entity == "hostnames":
        text = rest[0] if rest else os.environ.get("SLURM_JOB_NODELIST", "")
        if not text:
            raise CliError("scontrol show hostnames needs a host list (or SLURM_JOB_NODELIST set)")
        print("\n".join(hostlist.expand(text)))
        return 0
    if entity == "hostlist":
        if not rest:
            raise CliError("scontrol show hostlist needs a comma-separated list of hosts")
        print(hostlist.compress([h for h in rest[0].split(",") if h]))
        return 0
    if entity in LATER_ENTITIES:
        raise CliError(f"scontrol show {entity} is not supported by Corral yet")
    raise CliError(f"invalid entity: {words[0]} for keyword: show")


def _show_jobs(words: Sequence[str], oneliner: bool) -> int:
    from corral.cli.client import find_cluster
    from corral.schemas.api import JobsReply, JobsRequest

    if len(words) > 1:
        raise CliError(f"unexpected argument '{words[1]}' after the job id")
    refs = parse_job_refs([words[0]], "job id") if words else []
    reply = find_cluster().call("jobs", JobsRequest(job_ids=ids_of(refs)), JobsReply)
    jobs = [job for job in reply.jobs if named(refs, job.job_id, job.array_job_id, job.array_task_id)]
    if refs and not jobs:
        raise CliError("slurm_load_jobs error: Invalid job id specified")
    if not jobs:
        print("No jobs in the system")
        return 0
    now = time.time()
    out = []
    for job in jobs:
        lines = show_job(job, now, local_user)
        out.append(" ".join(lines) + "\n" if oneliner else "\n   ".join(lines) + "\n\n")
    sys.stdout.write("".join(out))
    return 0


def local_user(user: str) -> tuple[int, str, int] | None:
    """``(uid, group name, gid)`` of a local user, None if this machine does not know the name."""
    import grp
    import pwd

    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return None
    try:
        group = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        group = str(entry.pw_gid)
    return entry.pw_uid, group, entry.pw_gid


def show_job(job: JobInfo, now: float, lookup: UserLookup, tz: tzinfo | None = None) -> list[str]:
    """The lines of ``scontrol show job`` for one job (Slurm's keys, in Slurm's order)."""
    ids = lookup(job.user)
    user = f"{job.user}({ids[0]})" if ids else job.user
    group = f"{ids[1]}({ids[2]})" if ids else "(null)"
    pending = job.state == "PENDING"
    default = "slurm-%j.out" if job.array_task_id is None else "slurm-%A_%a.out"
    stdout = output_path(job.stdout or default, job)
    array = []
    if job.array_task_id is not None:
        array = [f"ArrayJobId={job.array_job_id} ArrayTaskId={job.array_task_id}"]
        if job.array_throttle:
            array[0] += f" ArrayTaskThrottle={job.array_throttle}"
    return [
        f"JobId={job.job_id} {array[0] + ' ' if array else ''}JobName={job.name}",
        f"UserId={user} GroupId={group} MCS_label=N/A",
        f"Priority={job.priority} Nice={job.nice} Account={job.account} QOS={job.qos or 'normal'}",
        f"JobState={job.state} Reason={job.reason or 'None'} Dependency={job.dependency or '(null)'}",
        f"Requeue={int(job.requeue)} Restarts={job.restart_count} BatchFlag=1 Reboot=0 "
        f"ExitCode={job.exit_code}:{job.signal}",
        f"RunTime={format_elapsed_sacct(_run_time(job, now))} TimeLimit={_limit(job.time_limit_s)} "
        "TimeMin=N/A",
        f"SubmitTime={format_timestamp(job.submit_time, tz)} EligibleTime={_eligible(job, tz)}",
        f"StartTime={format_timestamp(job.start_time, tz)} EndTime={_end(job, tz)} Deadline=N/A",
        f"Partition={job.partition} AllocNode:Sid=(null):0",
        f"NodeList={'(null)' if pending or not job.node_list else job.node_list}",
        f"NumNodes={job.num_nodes} NumCPUs={job.num_cpus} NumTasks={job.num_tasks} "
        f"CPUs/Task={max(job.num_cpus // max(job.num_tasks, 1), 1)}",
        f"TRES={_tres(job)}",
        f"MinMemoryNode={format_memory(job.min_memory_mb or 0)}",
        f"WorkDir={job.workdir}",
        f"StdErr={output_path(job.stderr, job) if job.stderr else stdout}",
        "StdIn=/dev/null",
        f"StdOut={stdout}",
        *_topology(job),
    ]


def _topology(job: JobInfo) -> list[str]:
    """Slurm's optional ``Switches=N@wait`` line (with ``SegmentSize=`` for --segment); none without them."""
    parts = []
    if job.switches:
        parts.append(f"Switches={job.switches}@{format_elapsed_sacct(job.switches_wait_s)}")
    if job.segment:
        parts.append(f"SegmentSize={job.segment}")
    return [" ".join(parts)] if parts else []


def output_path(pattern: str, job: JobInfo) -> str:
    """An output pattern with ``%j %J %A %a %x %u %N %%`` filled in, made absolute against the workdir.

    ``%N`` (the batch node) stays as is while the job has no node, as in Slurm; ``%A``/``%a`` are the
    array's id and the task's index for an array task (``%A`` is the job id otherwise, ``%a`` stays).
    """
    first = hostlist.first(job.node_list) if job.node_list else "%N"
    task = job.array_task_id
    values = {"j": str(job.job_id), "J": str(job.job_id), "x": job.name, "u": job.user}
    values |= {"A": str(job.array_job_id if task is not None else job.job_id)}
    values |= {"N": first, "%": "%"} | ({"a": str(task)} if task is not None else {})
    out = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "%" and index + 1 < len(pattern) and pattern[index + 1] in values:
            out.append(values[pattern[index + 1]])
            index += 2
            continue
        out.append(char)
        index += 1
    return posixpath.join(job.workdir, "".join(out))


def _run_time(job: JobInfo, now: float) -> int:
    if job.start_time is None or job.state == "PENDING":
        return 0
    end = job.end_time if job.end_time is not None else now
    return max(0, int(end - job.start_time))


def _limit(seconds: int | None) -> str:
    return "UNLIMITED" if seconds is None else format_elapsed_sacct(seconds)


def _eligible(job: JobInfo, tz: tzinfo | None) -> str:
    if job.begin_time is not None:
        return format_timestamp(job.begin_time, tz)
    if job.state == "PENDING" and job.reason in INELIGIBLE:
        return "Unknown"
    return format_timestamp(job.submit_time, tz)


def _end(job: JobInfo, tz: tzinfo | None) -> str:
    if job.end_time is not None:
        return format_timestamp(job.end_time, tz)
    if job.state == "RUNNING" and job.start_time is not None and job.time_limit_s is not None:
        return format_timestamp(job.start_time + job.time_limit_s, tz)
    return "Unknown"


def _tres(job: JobInfo) -> str:
    parts = [f"cpu={job.num_cpus}", f"node={job.num_nodes}"]
    if job.min_memory_mb:
        parts.insert(1, f"mem={format_memory(job.min_memory_mb * job.num_nodes)}")
    if job.gpus_per_node:
        parts.append(f"gres/gpu={job.gpus_per_node * job.num_nodes}")
    return ",".join(parts)


if __name__ == "__main__":
    sys.exit(main())
