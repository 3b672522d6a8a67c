"""sbatch's options and ``#SBATCH`` directives to a ``JobSpec`` (pure: IO is the caller's).

Rules (Slurm's, see SLURM_CONTRACT.md):

- ``sbatch [options] [SCRIPT [ARGS...]]``: options stop at the script; without a script it is read from
  stdin; ``--wrap=CMD`` makes a ``/bin/sh`` script instead.
- ``#SBATCH`` directives are the lines after the shebang up to the first command (blank lines and comments
  may come between); their values are shell-quoted, and ``#`` after a space starts a comment.
- Command-line options override directives; for every option the last value wins.
- Options Slurm has that Corral does not implement are refused by name, never ignored.

The script's checks and its directives' lines are in ``sbatch_script.py``, ``--export`` in ``sbatch_env.py``,
the options that each make one field in ``sbatch_values.py`` and those that shape the job together (nodes,
tasks, GPUs, memory) in ``sbatch_shape.py``; this module is the option table and the assembly.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

import msgspec

from corral.cli import sbatch_values
from corral.cli.errors import CliError
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, ParsedArgs, flag, parse_count, unsupported
from corral.cli.sbatch_env import export_environment
from corral.cli.sbatch_script import check_script, directive_lines, directive_words, wrap_script
from corral.cli.sbatch_shape import gpus_of, host_list, memory_per_node, per_gpu_option, task_counts
from corral.libs.slurm.constraint import parse_constraint
from corral.libs.slurm.cpus import cpus_per_node
from corral.schemas.events import JobSpec

OPTIONS = OptionTable(
    [
        Opt("job-name", "J"),
        Opt("output", "o"),
        Opt("error", "e"),
        Opt("nodes", "N"),
        Opt("ntasks", "n"),
        Opt("cpus-per-task", "c"),
        Opt("ntasks-per-node"),
        Opt("time", "t"),
        Opt("partition", "p"),
        Opt("account", "A"),
        Opt("gres"),
        Opt("gpus-per-node"),
        Opt("gpus-per-task"),
        Opt("gpus", "G"),
        Opt("cpus-per-gpu"),
        Opt("mem-per-gpu"),
        Opt("mem-per-cpu"),
        Opt("mem"),
        Opt("nodelist", "w"),
        Opt("exclude", "x"),
        Opt("constraint", "C"),
        flag("exclusive"),
        flag("parsable"),
        flag("test-only"),
        Opt("open-mode"),
        flag("requeue"),
        flag("no-requeue"),
        Opt("chdir", "D"),
        Opt("wrap"),
        Opt("export"),
        Opt("dependency", "d"),
        flag("hold", "H"),
        Opt("begin", "b"),
        Opt("array", "a"),
        Opt("qos", "q"),
        Opt("nice", optional=True),
        Opt("reservation"),
        Opt("switches"),
        Opt("segment"),
        Opt("signal"),
        Opt("wckey"),
        flag("help", "h"),
        flag("usage"),
        flag("version", "V"),
        *unsupported(
            "oversubscribe/s licenses/L clusters/M wait/W distribution/m input/i verbose/v quiet/Q "
            "no-kill/k overcommit/O core-spec/S immediate/I extra-node-info/B nodefile/F "
            "gpus-per-socket deadline mail-type "
            "mail-user comment priority time-min kill-on-invalid-dep ntasks-per-socket "
            "ntasks-per-core ntasks-per-gpu sockets-per-node cores-per-socket threads-per-core hint "
            "mincpus tmp gpu-bind gpu-freq cpu-freq get-user-env uid gid propagate profile container "
            "container-id tres-per-task tres-bind network acctg-freq spread-job "
            "use-min-nodes export-file batch bb bbf thread-spec delay-boot mcs-label power reboot "
            "ignore-pbs gres-flags mem-bind cluster-constraint prefer contiguous extra resv-ports "
            "wait-all-nodes stepmgr"
        ),
    ]
)


class Invocation(msgspec.Struct, frozen=True):
    """What the command line says before the script is read."""

    args: ParsedArgs  # the command-line options
    script_path: str | None  # the script file; None: stdin, or --wrap
    script_args: list[str]  # arguments for the script

    @property
    def wrap(self) -> str | None:
        """The ``--wrap`` command, if given."""
        return self.args.last("wrap")


class Submission(msgspec.Struct, frozen=True):
    """A job ready to submit, and how to report it."""

    spec: JobSpec  # the job
    parsable: bool  # print only the id
    test_only: bool = False  # --test-only: validate and estimate the start; submit nothing
    warnings: tuple[str, ...] = ()  # adjustments Slurm would also warn about


def parse_command_line(argv: Sequence[str]) -> Invocation:
    """Split sbatch's argv into options, the script path and the script's arguments."""
    args = OPTIONS.parse(argv, stop_at_positional=True)
    path = args.positionals[0] if args.positionals else None
    if args.given("wrap") and path is not None:
        raise CliError("Script arguments not permitted with --wrap option")
    return Invocation(args=args, script_path=path, script_args=list(args.rest))


def directive_options(script: str) -> ParsedArgs:
    """The options of all ``#SBATCH`` lines, in order; errors name the line."""
    merged = ParsedArgs()
    for number, text in directive_lines(script):
        try:
            words = directive_words(text)
            parsed = OPTIONS.parse(words)
        except ValueError as exc:
            raise CliError(f"cannot read #SBATCH line {number}: {exc}") from None
        except CliError as exc:
            raise CliError(f"{exc.message} (#SBATCH line {number})") from None
        if parsed.positionals:
            raise CliError(f"unexpected argument '{parsed.positionals[0]}' in #SBATCH line {number}")
        merged.values.extend(parsed.values)
    return merged


def build_submission(
    invocation: Invocation,
    script_data: bytes | None,
    *,
    environ: Mapping[str, str],
    cwd: str,
    hostname: str,
    now: float | None = None,
) -> Submission:
    """The job of one sbatch call; ``script_data`` is the file or stdin (None with ``--wrap``).

    ``now`` is the time ``--begin`` is relative to (``now+60``, ``16:00``); the clock if None.
    """
    wrap = invocation.wrap
    if wrap is not None:
        script, default_name = wrap_script(wrap), "wrap"
    else:
        script = check_script(script_data or b"")
        path = invocation.script_path
        default_name = posixpath.basename(path) if path else "sbatch"
    options = directive_options(script)
    options.values.extend(invocation.args.values)
    warnings: list[str] = []
    nodelist = host_list(options, "nodelist")
    nodes, ntasks, ntasks_per_node = task_counts(options, warnings, len(nodelist))
    gpus = gpus_of(options, nodes, ntasks_per_node or -(-ntasks // nodes))
    cpus_per_gpu_text = per_gpu_option(options, "cpus-per-gpu", "cpus-per-task", gpus.per_node)
    cpus_per_gpu = None if cpus_per_gpu_text is None else parse_count(cpus_per_gpu_text, "--cpus-per-gpu")
    cpus_per_task = parse_count(options.last("cpus-per-task", "1") or "", "--cpus-per-task")
    constraint = options.last("constraint")
    switches, switches_wait = sbatch_values.switches(options.last("switches"))
    spec = JobSpec(
        name=options.last("job-name") or default_name,
        script=script,
        argv=tuple(invocation.script_args),
        workdir=sbatch_values.workdir(options.last("chdir"), cwd),
        environment=export_environment(options.last("export", "ALL") or "", environ, warnings),
        stdout=sbatch_values.path_option(options, "output"),
        stderr=sbatch_values.path_option(options, "error"),
        open_mode=sbatch_values.open_mode(options.last("open-mode", "truncate") or ""),
        partition=sbatch_values.partition(options.last("partition")),
        account=options.last("account") or None,
        cpus_per_task=cpus_per_task,
        nodes=nodes,
        ntasks=ntasks,
        ntasks_per_node=ntasks_per_node,
        mem_per_node_mb=memory_per_node(
            options,
            gpus.per_node,
            cpus_per_node(
                nodes,
                ntasks,
                ntasks_per_node,
                cpus_per_task,
                gpus.per_node,
                cpus_per_gpu,
            ),
        ),
        gpus_per_node=gpus.per_node,
        gpu_type=gpus.type,
        time_limit_s=sbatch_values.time_limit(options.last("time")),
        requeue=sbatch_values.requeue(options),
        submit_host=hostname,
        dependencies=sbatch_values.dependencies(options.last("dependency")),
        held=options.given("hold"),
        begin_time=sbatch_values.begin(options.last("begin"), now),
        array=sbatch_values.array(options.last("array")),
        nodelist=tuple(nodelist),
        exclude=tuple(host_list(options, "exclude")),
        constraint=None if constraint is None else parse_constraint(constraint, "--constraint"),
        exclusive=options.given("exclusive"),
        gpus_per_task=gpus.per_task,
        cpus_per_gpu=cpus_per_gpu,
        qos=sbatch_values.qos(options.last("qos")),
        nice=sbatch_values.nice(options.last("nice")),
        reservation=options.last("reservation") or None,
        switches=switches,
        switches_wait_s=switches_wait,
        segment=sbatch_values.segment(options.last("segment"), nodes),
        warn_signal=sbatch_values.warn_signal(options.last("signal")),
        wckey=options.last("wckey") or None,
        command=None
        if wrap is not None or not invocation.script_path
        else _absolute(invocation.script_path, cwd),
        ntasks_set=options.given("ntasks") or ntasks_per_node is not None,
    )
    return Submission(
        spec=spec,
        parsable=options.given("parsable"),
        test_only=options.given("test-only"),
        warnings=tuple(warnings),
    )


def _absolute(path: str, cwd: str) -> str:
    """The script's path as scontrol's ``Command=`` shows it: absolute, against the submit directory."""
    return posixpath.normpath(posixpath.join(cwd, path))
