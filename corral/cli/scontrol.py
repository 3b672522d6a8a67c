"""``scontrol``: ``hold``, ``release``, ``update JobId=``, ``show job`` and ``show hostnames``/``hostlist``.

- ``scontrol hold ID[,ID...] [ID...]`` and ``scontrol release ...`` go to the gateway (verbs ``hold`` and
  ``release``; an array's id means every task, ``A_T``/``A_[1-3]`` some tasks); each job that could not
  be held or released gets its own ``scontrol: error: <why> for job <id>`` line and the exit status is
  then 1;
- ``scontrol update JobId=ID [TimeLimit=TIME] [Partition=NAME] [Priority=N]`` changes a pending job (verb
  ``update``; a user may only lower a time limit, only an admin sets a priority, and ``Priority=0`` holds
  the job, as in Slurm);
- ``scontrol show job [ID]`` prints Slurm's multi-line ``Key=Value`` record of each job (``-o``: one line
  each; ``scontrol_show_job.py``); ``show hostnames [LIST]`` and ``show hostlist LIST`` expand and
  compress host lists locally (``LIST`` defaults to ``SLURM_JOB_NODELIST``);
- ``scontrol create reservation ...``, ``delete ReservationName=X`` and ``show reservation[s] [X]``:
  advance reservations (``scontrol_resv.py``);
- ``scontrol update NodeName=LIST State=DRAIN Reason=TEXT|RESUME`` (admins) and ``show node``:
  ``scontrol_nodes.py``;
- ``scontrol ping``: Slurm's ``Slurmctld(primary) at NAME is UP`` line for the leading scheduler, then one
  ``Slurmctld(backup) ...`` line per standby (verb ``ping``, any scheduler answers);
- the other commands of Slurm's scontrol are refused by name as not supported by Corral yet.

Commands and ``show`` entities are case-insensitive, as in Slurm. Parsing is pure: ``control_ids``,
``update_request``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from corral.cli import scontrol_nodes, scontrol_resv, scontrol_show_job
from corral.cli.errors import EXIT_FAILURE, CliError, error_line, run_command
from corral.cli.jobrefs import JobRef, batches, job_label, parse_job_refs, split_job_list, split_refs
from corral.cli.options import OptionTable, flag, parse_job_ids, unsupported, version_text
from corral.libs.slurm import hostlist
from corral.libs.slurm.timefmt import parse_time_limit

if TYPE_CHECKING:
    from corral.schemas.api import ControlReply, UpdateRequest

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
  ping                        the schedulers: the leader (primary) and the standbys (backup), UP or DOWN
  -o, --oneliner              one line per record
"""

#: Slurm's scontrol commands that Corral does not implement yet.
LATER_COMMANDS = frozenset(
    {
        "uhold", "suspend", "resume", "top", "notify", "reboot",
        "reconfigure", "listpids", "shutdown", "takeover", "token", "wait_job",
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
    if command == "ping":
        return _ping()
    if command == "create":
        return scontrol_resv.create(rest)
    if command == "delete":
        return scontrol_resv.delete(rest)
    if command in LATER_COMMANDS:
        raise CliError(f"scontrol {command} is not supported by Corral yet")
    raise CliError(f"invalid keyword: {words[0]}")


def _ping() -> int:
    """Slurm's lines: ``Slurmctld(primary) at NAME is UP``, then each backup; exit 1 if none is up."""
    from corral.cli.client import find_cluster
    from corral.schemas.api import PingReply, PingRequest

    try:
        reply = find_cluster().call("ping", PingRequest(), PingReply)
    except CliError:
        # No scheduler answers (none runs, or NATS is away): Slurm's line for an unreachable primary.
        print("Slurmctld(primary) at (none) is DOWN")
        return 1
    if not any(c.role == "primary" for c in reply.controllers):
        print("Slurmctld(primary) at (none) is DOWN")  # between a release and the takeover
    for c in reply.controllers:
        print(f"Slurmctld({c.role}) at {c.name} is {'UP' if c.up else 'DOWN'}")
    return 0 if any(c.up for c in reply.controllers) else 1


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

    requests: list[HoldRequest | ReleaseRequest | RequeueRequest] = []
    for batch in batches(control_ids(words, command)):
        ids, tasks = split_refs(batch)
        if command == "release":
            requests.append(ReleaseRequest(job_ids=ids, tasks=tasks))
        elif command.startswith("requeue"):
            requests.append(RequeueRequest(job_ids=ids, tasks=tasks, hold=command == "requeuehold"))
        else:
            requests.append(HoldRequest(job_ids=ids, tasks=tasks))
    verb = "requeue" if command.startswith("requeue") else command
    if verb == "requeue":
        # A job usually requeues itself, and the requeue's kill sequence (SIGCONT+SIGTERM to every process
        # of the job, scontrol included) can arrive before this process has exited: a requeue that was
        # accepted must still be reported as such (exit 0), so SIGTERM waits until scontrol is done (the
        # KillWait SIGKILL still ends it). Slurm's scontrol, in C, exits before its kill arrives.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    cluster = find_cluster()
    outcomes = [o for request in requests for o in cluster.call(verb, request, ControlReply).outcomes]
    return _report(ControlReply(outcomes=outcomes))


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
        return scontrol_show_job.show(rest, oneliner)
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


if __name__ == "__main__":
    sys.exit(main())
