"""sbatch's options and ``#SBATCH`` directives to a ``JobSpec`` (pure: IO is the caller's).

Rules (Slurm's, see SLURM_CONTRACT.md):

- ``sbatch [options] [SCRIPT [ARGS...]]``: options stop at the script; without a script it is read from
  stdin; ``--wrap=CMD`` makes a ``/bin/sh`` script instead.
- ``#SBATCH`` directives are the lines after the shebang up to the first command (blank lines and comments
  may come between); their values are shell-quoted, and ``#`` after a space starts a comment.
- Command-line options override directives; for every option the last value wins.
- Options Slurm has that Corral does not implement are refused by name, never ignored.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import time
from collections.abc import Mapping, Sequence

import msgspec

from corral.cli.errors import CliError
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, ParsedArgs, flag, parse_count, unsupported
from corral.cli.sbatch_shape import gpus_of, host_list, memory_per_node, per_gpu_option, task_counts
from corral.libs.slurm.array import parse_array
from corral.libs.slurm.constraint import parse_constraint
from corral.libs.slurm.cpus import cpus_per_node
from corral.libs.slurm.dependency import parse_dependency
from corral.libs.slurm.signals import parse_signal_option
from corral.libs.slurm.timefmt import parse_begin_time, parse_time_limit
from corral.schemas.events import ArraySpec, Dependencies, JobSpec, OpenMode, WarnSignal

#: Largest batch script accepted, in bytes (Slurm's default max_script_size).
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
#: Largest exported environment, in bytes of ``NAME=value`` entries.
MAX_ENVIRONMENT_BYTES = 1024 * 1024

NOT_A_SCRIPT = (
    "This does not look like a batch script.  "
    "The first line must start with #! followed by the path to an interpreter."
)
#: Variables never inherited by a job: a job submitted from inside a job must not carry its parent's identity.
INHERITED_PREFIXES_DROPPED = ("SLURM_", "SBATCH_")

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

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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


def directive_lines(script: str) -> list[tuple[int, str]]:
    """The ``#SBATCH`` lines of a script as (line number, text after ``#SBATCH``)."""
    found: list[tuple[int, str]] = []
    for number, line in enumerate(script.split("\n")[1:], start=2):
        if line.startswith("#SBATCH") and (len(line) == 7 or line[7].isspace()):
            found.append((number, line[7:]))
        elif line.strip() and not line.lstrip().startswith("#"):
            break
    return found


def directive_options(script: str) -> ParsedArgs:
    """The options of all ``#SBATCH`` lines, in order; errors name the line."""
    merged = ParsedArgs()
    for number, text in directive_lines(script):
        try:
            words = shlex.split(_strip_comment(text))
            parsed = OPTIONS.parse(words)
        except ValueError as exc:
            raise CliError(f"cannot read #SBATCH line {number}: {exc}") from None
        except CliError as exc:
            raise CliError(f"{exc.message} (#SBATCH line {number})") from None
        if parsed.positionals:
            raise CliError(f"unexpected argument '{parsed.positionals[0]}' in #SBATCH line {number}")
        merged.values.extend(parsed.values)
    return merged


def _strip_comment(text: str) -> str:
    """Cut a ``#`` comment that starts a word outside quotes, as a shell would."""
    quote = ""
    escaped = False
    for index, char in enumerate(text):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1].isspace()):
            return text[:index]
    return text


def check_script(data: bytes) -> str:
    """The script's text, after Slurm's checks (size, shebang, line breaks)."""
    if len(data) > MAX_SCRIPT_BYTES:
        raise CliError(f"batch script is {len(data)} bytes, more than the limit of {MAX_SCRIPT_BYTES}")
    try:
        script = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"batch script is not UTF-8 text (byte {exc.start})") from None
    if not script:
        raise CliError("Batch script is empty!")
    if not script.strip():
        raise CliError("Batch script contains only whitespace!")
    if not script.startswith("#!"):
        raise CliError(NOT_A_SCRIPT)
    if "\r\n" in script:
        raise CliError(
            "Batch script contains DOS line breaks (\\r\\n) instead of expected UNIX line breaks (\\n)."
        )
    return script


def wrap_script(command: str) -> str:
    """The script sbatch writes for ``--wrap``."""
    return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"


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
    switches, switches_wait = _switches(options.last("switches"))
    spec = JobSpec(
        name=options.last("job-name") or default_name,
        script=script,
        argv=invocation.script_args,
        workdir=_workdir(options.last("chdir"), cwd),
        environment=export_environment(options.last("export", "ALL") or "", environ, warnings),
        stdout=_path_option(options, "output"),
        stderr=_path_option(options, "error"),
        open_mode=_open_mode(options.last("open-mode", "truncate") or ""),
        partition=_partition(options.last("partition")),
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
        time_limit_s=_time_limit(options.last("time")),
        requeue=_requeue(options),
        submit_host=hostname,
        dependencies=_dependencies(options.last("dependency")),
        held=options.given("hold"),
        begin_time=_begin(options.last("begin"), now),
        array=_array(options.last("array")),
        nodelist=nodelist,
        exclude=host_list(options, "exclude"),
        constraint=None if constraint is None else parse_constraint(constraint, "--constraint"),
        exclusive=options.given("exclusive"),
        gpus_per_task=gpus.per_task,
        cpus_per_gpu=cpus_per_gpu,
        qos=_qos(options.last("qos")),
        nice=_nice(options.last("nice")),
        reservation=options.last("reservation") or None,
        switches=switches,
        switches_wait_s=switches_wait,
        segment=_segment(options.last("segment"), nodes),
        warn_signal=_warn_signal(options.last("signal")),
        wckey=options.last("wckey") or None,
    )
    return Submission(
        spec=spec,
        parsable=options.given("parsable"),
        test_only=options.given("test-only"),
        warnings=tuple(warnings),
    )


def export_environment(spec: str, environ: Mapping[str, str], warnings: list[str]) -> dict[str, str]:
    """The environment a job gets for ``--export`` (``ALL``, ``NONE``, ``[ALL|NONE,]VAR[=value],...``).

    Inherited ``SLURM_*`` and ``SBATCH_*`` variables are dropped; variables set explicitly are kept.
    """
    items = [item for item in spec.split(",") if item]
    if not items:
        raise CliError(f'invalid --export "{spec}": use ALL, NONE or [ALL,]NAME[=value],...')
    keyword = items[0].upper()
    if keyword in ("ALL", "NONE"):
        items = items[1:]
    env: dict[str, str] = {}
    if keyword == "ALL":
        env = {k: v for k, v in environ.items() if not k.startswith(INHERITED_PREFIXES_DROPPED)}
    for item in items:
        name, has_value, value = item.partition("=")
        if not _VARIABLE.fullmatch(name):
            raise CliError(f'invalid --export "{spec}": "{name}" is not a variable name')
        if has_value:
            env[name] = value
        elif name in environ:
            env[name] = environ[name]
    return _bounded(env, warnings)


def _bounded(env: dict[str, str], warnings: list[str]) -> dict[str, str]:
    """Drop variables that cannot be sent as text; refuse an environment over the size limit."""
    kept: dict[str, str] = {}
    size = 0
    for name, value in env.items():
        try:
            size += len(name.encode()) + len(value.encode()) + 2
        except UnicodeEncodeError:
            warnings.append(f"not exporting {name}: its value is not valid UTF-8")
            continue
        kept[name] = value
    if size > MAX_ENVIRONMENT_BYTES:
        raise CliError(
            f"the environment to export is {size} bytes, more than the limit of {MAX_ENVIRONMENT_BYTES}: "
            "unset large variables or choose them with --export=NONE,VAR,..."
        )
    return kept


def _workdir(chdir: str | None, cwd: str) -> str:
    if chdir is None:
        return posixpath.normpath(cwd)
    if not chdir:
        raise CliError('invalid --chdir "": give a directory')
    return posixpath.normpath(posixpath.join(cwd, os.path.expanduser(chdir)))


def _path_option(options: ParsedArgs, name: str) -> str | None:
    value = options.last(name)
    if value is not None and not value:
        raise CliError(f'invalid --{name} "": give a file name pattern')
    return value


def _open_mode(value: str) -> OpenMode:
    mode = value.strip().lower()
    if mode == "append":
        return "append"
    if mode == "truncate":
        return "truncate"
    raise CliError(f'invalid --open-mode "{value}": use append or truncate')


def _partition(value: str | None) -> str | None:
    if value is not None and "," in value:
        raise CliError(f"--partition={value}: a list of partitions is not supported by Corral yet")
    return value or None


def _qos(value: str | None) -> str | None:
    if value is None:
        return None
    if not value.strip():
        raise CliError("Invalid qos specification: --qos needs a QOS name")
    return value.strip()


#: Slurm's bound of a nice value (NICE_OFFSET - 3).
MAX_NICE = 2147483645


def _nice(value: str | None) -> int:
    """``--nice`` alone is 100, as in Slurm; ``--nice=N`` any whole number within Slurm's bounds."""
    if value is None:
        return 0
    if value == "":
        return 100
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isdigit() or len(digits) > 10 or abs(int(text)) > MAX_NICE:
        raise CliError(f'Invalid nice value "{value}": use a whole number between -{MAX_NICE} and {MAX_NICE}')
    return int(text)


def _time_limit(value: str | None) -> int | None:
    return None if value is None else parse_time_limit(value, "--time")


def _warn_signal(value: str | None) -> WarnSignal | None:
    """``--signal=[{R|B}:]SIG[@T]``: the warning signal before the time limit."""
    if value is None:
        return None
    sig = parse_signal_option(value, "--signal")
    return WarnSignal(signum=sig.signum, seconds_before=sig.seconds_before, batch_only=sig.batch_only)


def _dependencies(value: str | None) -> Dependencies | None:
    return None if value is None else parse_dependency(value, "--dependency")


def _array(value: str | None) -> ArraySpec | None:
    return None if value is None else parse_array(value, "--array")


def _begin(value: str | None, now: float | None) -> float | None:
    if value is None:
        return None
    return parse_begin_time(value, time.time() if now is None else now, "--begin")


def _switches(value: str | None) -> tuple[int | None, int | None]:
    """``--switches=N[@T]``: at most N topology blocks, waiting at most T for them (a Slurm duration)."""
    if value is None:
        return None, None
    count, at, wait = value.partition("@")
    switches = parse_count(count, "--switches")
    if not at:
        return switches, None
    if not wait.strip():
        raise CliError(f'invalid --switches "{value}": give a wait after @, e.g. --switches=1@10:00')
    seconds = parse_time_limit(wait, "--switches")
    if seconds is None and wait.strip().lower() not in ("unlimited", "infinite", "-1"):
        seconds = 0  # parse_time_limit reads 0 as "no limit"; a switch wait of 0 is no wait at all
    return switches, seconds


def _segment(value: str | None, nodes: int) -> int | None:
    """``--segment=N``: the job's nodes in segments of N, each inside one topology block."""
    if value is None:
        return None
    segment = parse_count(value, "--segment")
    if nodes % segment:
        raise CliError(
            f"--segment={value}: the job's {nodes} nodes are not a multiple of the segment size; "
            f"ask for a multiple of {segment} nodes (-N) or a segment size that divides {nodes}"
        )
    return segment


def _requeue(options: ParsedArgs) -> bool:
    choice = True
    for key, _ in options.values:
        if key in ("requeue", "no-requeue"):
            choice = key == "requeue"
    return choice
