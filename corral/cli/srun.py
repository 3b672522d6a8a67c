"""``srun``: run a parallel step; inside a job a step of it, outside one an allocation made for it.

Inside an allocation (``SLURM_JOB_ID`` set) srun asks the agent of the job's batch node (the first host of
``SLURM_JOB_NODELIST``) to start a step (``corral.schemas.steps``): the agent checks that the caller owns
the job, numbers the step, lays the tasks out over the job's nodes and starts them through their agents.
srun streams the tasks' output (``-l`` labels each line with its task), forwards its stdin to task 0 and
Ctrl-C to the tasks (twice within a second kills the step), and exits with the worst task's status.

Outside an allocation it submits a job whose batch script only waits (``ALLOCATION_SCRIPT``), waits for
it to run, runs the step as above and releases the allocation with the step's exit code, so the job ends
COMPLETED (or FAILED with that code). ``-n -N -c --ntasks-per-node`` and ``SLURM_NTASKS``/``SLURM_NNODES``/
``SLURM_NTASKS_PER_NODE`` (Slurm's input variables) size the step. The tasks learn where srun is
(``StepLaunch.srun_host``/``srun_port``: its connection's address) and get its umask (``SLURM_UMASK``).

srun uses the synchronous NATS client like the other commands (``srun_step``: subscriptions, publish
and a ``select`` loop), not nats-py and asyncio, whose import alone would double its start-up.
"""

from __future__ import annotations

import os
import posixpath
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from corral.cli.errors import CliError, run_command, warn
from corral.cli.options import Option, OptionTable, ParsedArgs, flag, parse_count, unsupported, version_text
from corral.libs.slurm import hostlist
from corral.schemas.steps import ALLOCATION_SCRIPT, AllocationRelease, StepDone, StepLaunch, step_subject

if TYPE_CHECKING:
    from corral.cli.client import Cluster
    from corral.schemas.events import JobSpec, OpenMode

COMMAND = "srun"


def _opt(name: str, short: str = "") -> Option:
    return Option(name, short)


#: Options that shape the allocation (outside a job they go to the submission, as sbatch's).
ALLOCATION_OPTIONS = frozenset(
    [
        "job-name",
        "partition",
        "account",
        "time",
        "gres",
        "gpus-per-node",
        "gpus",
        "mem",
        "mem-per-cpu",
        "nodelist",
        "exclude",
        "constraint",
        "exclusive",
        "qos",
        "reservation",
        "chdir",
        "export",
        "cpus-per-gpu",
        "mem-per-gpu",
    ]
)

OPTIONS = OptionTable(
    [
        _opt("job-name", "J"),
        _opt("nodes", "N"),
        _opt("ntasks", "n"),
        _opt("cpus-per-task", "c"),
        _opt("ntasks-per-node"),
        _opt("gpus-per-task"),
        _opt("output", "o"),
        _opt("error", "e"),
        _opt("open-mode"),
        flag("label", "l"),
        flag("unbuffered", "u"),
        _opt("time", "t"),
        _opt("partition", "p"),
        _opt("account", "A"),
        _opt("gres"),
        _opt("gpus-per-node"),
        _opt("gpus", "G"),
        _opt("cpus-per-gpu"),
        _opt("mem-per-gpu"),
        _opt("mem"),
        _opt("mem-per-cpu"),
        _opt("nodelist", "w"),
        _opt("exclude", "x"),
        _opt("constraint", "C"),
        flag("exclusive"),
        _opt("qos", "q"),
        _opt("reservation"),
        _opt("chdir", "D"),
        _opt("export"),
        _opt("mpi"),  # accepted: Corral has no MPI plugins (--mpi=none is what clients pass)
        _opt("cpu-bind"),  # accepted and ignored: tasks are not pinned to CPUs
        flag("verbose", "v"),
        flag("quiet", "Q"),
        flag("help", "h"),
        flag("usage"),
        flag("version", "V"),
        *unsupported(
            "input/i kill-on-bad-exit/K distribution/m relative/r overcommit/O wait/W "
            "signal dependency/d begin/b immediate/I hold/H nice pty multi-prog "
            "ntasks-per-gpu gpu-bind overlap exact whole het-group cpus-per-gpu-step slurmd-debug "
            "disable-status/X no-allocate/Z jobid core-spec/S threads/T"
        ),
    ]
)

USAGE = """\
Usage: srun [OPTIONS...] COMMAND [ARGS...]

  -n, --ntasks=N              number of tasks        -N, --nodes=N           number of nodes
      --ntasks-per-node=N     tasks per node         -c, --cpus-per-task=N   CPUs per task
      --gpus-per-task=N       GPUs of each task (each its own CUDA_VISIBLE_DEVICES)
  -l, --label                 prefix output lines with the task id
  -o, --output=PATTERN        tasks' stdout to files (%j job, %J job.step, %s step, %t task, %n node
                              index, %N node, %x job name, %u user)
  -e, --error=PATTERN         tasks' stderr to files    --open-mode=append|truncate
  -u, --unbuffered            pass output on as it comes (srun never holds it back without -l)
  -J, --job-name=NAME         step (and, outside a job, job) name
  Outside an allocation also: -p -A -t --gres --gpus-per-node -G --mem -w -x -C --exclusive -q
  --reservation -D --export (as sbatch's)
  -h, --help                  this help          -V, --version           version
"""


class SrunArgs(msgspec.Struct, frozen=True):
    """One srun command line."""

    options: ParsedArgs  # the options, in the order given
    argv: list[str]  # the command and its arguments

    def value(self, name: str) -> str | None:
        """The last value of an option."""
        return self.options.last(name)


def parse_args(argv: list[str], require_command: bool = True) -> SrunArgs:
    """Parse the command line; CliError for a bad option or (``require_command``) no command."""
    options = OPTIONS.parse(argv, stop_at_positional=True)
    command = options.positionals[:1] + options.rest
    if require_command and not command and not any(options.given(n) for n in ("help", "usage", "version")):
        raise CliError("No command given to execute. (srun COMMAND [ARGS...])")
    return SrunArgs(options=options, argv=command)


def _count(args: SrunArgs, name: str, environ: Mapping[str, str], variable: str | None = None) -> int | None:
    text = args.value(name)
    if text is None and variable is not None:
        text = environ.get(variable) or None
    return parse_count(text, f"--{name}") if text is not None else None


def open_mode(option: str | None, variable: str | None) -> OpenMode:
    """``--open-mode``, else ``SLURM_OPEN_MODE`` (sbatch's ``--open-mode`` in a job, ``a`` or ``t``), else
    truncate. A bad option is refused, a variable that says neither is ignored."""
    if option is not None:
        if option not in ("append", "truncate"):
            raise CliError(f'invalid --open-mode "{option}": use append or truncate')
        return "append" if option == "append" else "truncate"
    return "append" if (variable or "")[:1].lower() == "a" else "truncate"


def step_launch(args: SrunArgs, environ: Mapping[str, str], cwd: str, inside: bool) -> StepLaunch:
    """The step request of a command line; inside a job ``SLURM_NTASKS``/``SLURM_NNODES`` and
    ``SLURM_NTASKS_PER_NODE`` are the defaults of ``-n``/``-N`` and ``--ntasks-per-node`` (Slurm's input
    variables), SLURM_NTASKS unless -N or --ntasks-per-node is given. The tasks get srun's environment
    with ``SLURM_UMASK`` (srun's umask) and ``SRUN_DEBUG`` (3, one more per -v, one less per -Q) added
    unless set, as Slurm's srun adds them."""
    per_node = _count(args, "ntasks-per-node", environ, "SLURM_NTASKS_PER_NODE" if inside else None)
    nodes = _count(args, "nodes", environ, "SLURM_NNODES" if inside else None)
    sized = args.options.given("nodes") or per_node is not None
    ntasks = _count(args, "ntasks", environ, "SLURM_NTASKS" if inside and not sized else None)
    gpus_per_task = _count(args, "gpus-per-task", environ)
    cpus = _count(args, "cpus-per-task", environ) or 1
    mode = open_mode(args.value("open-mode"), environ.get("SLURM_OPEN_MODE"))
    workdir = args.value("chdir") or cwd
    return StepLaunch(
        job_id=0,
        key=os.urandom(8).hex(),
        argv=args.argv,
        cwd=workdir if posixpath.isabs(workdir) else posixpath.join(cwd, workdir),
        environment=_with_srun_variables(environ, args),
        name=args.value("job-name") or posixpath.basename(args.argv[0]),
        ntasks=ntasks,
        nodes=nodes,
        ntasks_per_node=per_node,
        cpus_per_task=cpus,
        gpus_per_task=gpus_per_task,
        stdout=args.value("output"),
        stderr=args.value("error"),
        open_mode=mode,
        stdin=True,
    )


def _with_srun_variables(environ: Mapping[str, str], args: SrunArgs) -> dict[str, str]:
    """srun's environment plus what Slurm's srun adds to it unless set: SLURM_UMASK, SRUN_DEBUG."""
    env = dict(environ)
    mask = os.umask(0)
    os.umask(mask)
    env.setdefault("SLURM_UMASK", f"0{(mask >> 6) & 7}{(mask >> 3) & 7}{mask & 7}")
    verbosity = len(args.options.all("verbose")) - len(args.options.all("quiet"))
    env.setdefault("SRUN_DEBUG", str(3 + verbosity))
    return env


def allocation_argv(args: SrunArgs, launch: StepLaunch) -> list[str]:
    """sbatch's options for the allocation of a step outside a job: the allocation options as given,
    plus the step's shape (nodes, tasks), so the allocation fits it."""
    out = [
        f"--{name}" if name == "exclusive" else f"--{name}={value}"
        for name, value in args.options.values
        if name in ALLOCATION_OPTIONS
    ]
    if not args.options.given("job-name"):
        out.append(f"--job-name={launch.name}")
    for name, value in (
        ("nodes", launch.nodes),
        ("ntasks", launch.ntasks),
        ("ntasks-per-node", launch.ntasks_per_node),
        ("cpus-per-task", launch.cpus_per_task if launch.cpus_per_task > 1 else None),
        ("gpus-per-task", launch.gpus_per_task),
    ):
        if value is not None:
            out.append(f"--{name}={value}")
    return out


def allocation_spec(sbatch_argv: list[str], environ: Mapping[str, str], cwd: str) -> JobSpec:
    """The job of an interactive allocation: the waiting script, no output file."""
    from corral.cli.sbatch_args import build_submission, parse_command_line

    invocation = parse_command_line(sbatch_argv)
    submission = build_submission(
        invocation, ALLOCATION_SCRIPT.encode(), environ=environ, cwd=cwd, hostname=os.uname().nodename
    )
    for message in submission.warnings:
        warn(COMMAND, message)
    return msgspec.structs.replace(submission.spec, stdout="/dev/null", stderr=None, interactive=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``srun``."""
    return run_command(COMMAND, _srun, argv)


def _srun(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.options.given("help") or args.options.given("usage"):
        sys.stdout.write(USAGE)
        return 0
    if args.options.given("version"):
        print(version_text())
        return 0
    try:
        cwd = os.getcwd()
    except OSError as exc:
        raise CliError(f"cannot tell the current directory: {exc.strerror}") from None
    from corral.cli.client import find_cluster

    environ = dict(os.environ)
    job_text = environ.get("SLURM_JOB_ID", "")
    if job_text:
        if not job_text.isdigit():
            raise CliError(f"SLURM_JOB_ID={job_text} is not a job id")
        launch = step_launch(args, environ, cwd, inside=True)
        nodelist = environ.get("SLURM_JOB_NODELIST", "")
        if not nodelist:
            raise CliError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST is not: not inside a Corral job")
        launch = msgspec.structs.replace(launch, job_id=int(job_text))
        return run_step(find_cluster(), hostlist.first(nodelist), launch, args)
    launch = step_launch(args, environ, cwd, inside=False)
    spec = allocation_spec(allocation_argv(args, launch), environ, cwd)
    cluster = find_cluster()
    with Allocation(cluster, spec) as alloc:
        launch = msgspec.structs.replace(launch, job_id=alloc.job_id)
        status = run_step(cluster, alloc.batch_node, launch, args)
        alloc.exit_code = status
    return status


class Allocation:
    """An interactive allocation: submitted on enter, released (or cancelled) on exit."""

    def __init__(self, cluster: Cluster, spec: JobSpec, command: str = COMMAND) -> None:
        self.cluster = cluster
        self.spec = spec
        self.command = command
        self.job_id = 0
        self.batch_node = ""
        self.nodelist = ""
        self.exit_code: int | None = None  # set once the work ran: release with it; None: cancel

    def __enter__(self) -> Allocation:
        from corral.cli.sbatch import submit

        self.job_id = submit(self.cluster, self.spec)
        try:
            self._wait_running()
        except BaseException:
            self._cancel()
            raise
        return self

    def _wait_running(self) -> None:
        from corral.schemas.api import JobsReply, JobsRequest

        said_queued = False
        started = time.monotonic()
        while True:
            reply = self.cluster.call(
                "jobs", JobsRequest(job_ids=[self.job_id], include_finished=True), JobsReply
            )
            job = reply.jobs[0] if reply.jobs else None
            # RUNNING once allocated; run_started once the batch node's agent has the launch (before that
            # it would refuse the step as not running there).
            if job is not None and job.state == "RUNNING" and job.node_list and job.run_started:
                if said_queued:
                    print(f"{self.command}: job {self.job_id} has been allocated resources", file=sys.stderr)
                self.nodelist = job.node_list
                self.batch_node = hostlist.first(job.node_list)
                return
            if job is not None and job.state not in ("PENDING", "RUNNING", "REQUEUED"):
                raise CliError(f"Job {self.job_id} ended before it started: {job.state} ({job.reason})")
            if not said_queued and job is not None and job.state == "PENDING":
                print(f"{self.command}: job {self.job_id} queued and waiting for resources", file=sys.stderr)
                said_queued = True
            # Poll briskly at first (an idle cluster starts a job in tens of ms), gently after.
            time.sleep(0.02 if time.monotonic() - started < 2 else 0.2)

    def _cancel(self) -> None:
        from corral.schemas.api import CancelReply, CancelRequest

        try:
            self.cluster.call("cancel", CancelRequest(job_ids=[self.job_id]), CancelReply)
        except CliError as exc:
            warn(self.command, f"could not cancel job {self.job_id}: {exc.message}")

    def __exit__(self, *exc: object) -> None:
        if self.exit_code is None:
            self._cancel()
            return
        release = AllocationRelease(job_id=self.job_id, exit_code=min(self.exit_code, 255))
        try:
            agent_call(self.cluster, self.batch_node, release, StepDone)
        except CliError as exc:
            warn(self.command, f"could not release job {self.job_id} ({exc.message}); cancelling it")
            self._cancel()


def agent_call(cluster: Cluster, node: str, request: msgspec.Struct, reply_type: type[Any]) -> Any:
    """One request to a node's agent, with the synchronous client (retried as ``Cluster.request``)."""
    from corral.cli.client import decode_reply
    from corral.libs.runtime import nats_request

    try:
        reply = cluster.request(step_subject(node, cluster.user), msgspec.json.encode(request))
    except nats_request.NoResponders:
        raise CliError(f"the agent of node {node} is not answering") from None
    except nats_request.NatsRequestError as exc:
        raise CliError(str(exc)) from None
    return decode_reply(reply.data, reply_type)


def run_step(cluster: Cluster, batch_node: str, launch: StepLaunch, args: SrunArgs) -> int:
    """Start the step, stream it to the terminal, and return the worst task's status."""
    from corral.cli.srun_step import StepSession

    session = StepSession(
        cluster,
        batch_node,
        launch,
        label=args.options.given("label"),
        command=COMMAND,
    )
    return session.run()


if __name__ == "__main__":
    sys.exit(main())
