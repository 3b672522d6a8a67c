"""sbatch's options that each make one field of a ``JobSpec``: the value of the option, checked and turned
into the field (``--chdir``, ``-o``/``-e``, ``--open-mode``, ``-p``, ``-q``, ``--nice``, ``-t``, ``--signal``,
``-d``, ``--array``, ``--begin``, ``--switches``, ``--segment``, ``--requeue``). Pure but for ``begin``,
which reads the clock when not given the time. The options that shape the job together are in
``sbatch_shape.py``.
"""

from __future__ import annotations

import os
import posixpath
import time

from corral.cli.errors import CliError
from corral.cli.options import ParsedArgs, parse_count
from corral.libs.slurm.array import parse_array
from corral.libs.slurm.dependency import parse_dependency
from corral.libs.slurm.signals import parse_signal_option
from corral.libs.slurm.timefmt import parse_begin_time, parse_time_limit
from corral.schemas.events import ArraySpec, Dependencies, OpenMode, WarnSignal
from corral.schemas.job_spec import MAX_NICE


def workdir(chdir: str | None, cwd: str) -> str:
    """``--chdir``: the job's working directory, relative to ``cwd`` (``~`` expanded); ``cwd`` without it."""
    if chdir is None:
        return posixpath.normpath(cwd)
    if not chdir:
        raise CliError('invalid --chdir "": give a directory')
    return posixpath.normpath(posixpath.join(cwd, os.path.expanduser(chdir)))


def path_option(options: ParsedArgs, name: str) -> str | None:
    """``-o``/``-e`` (``name``): the file name pattern, None when not given; an empty one is refused."""
    value = options.last(name)
    if value is not None and not value:
        raise CliError(f'invalid --{name} "": give a file name pattern')
    return value


def open_mode(value: str) -> OpenMode:
    """``--open-mode``: ``append`` or ``truncate``, in any case."""
    mode = value.strip().lower()
    if mode == "append":
        return "append"
    if mode == "truncate":
        return "truncate"
    raise CliError(f'invalid --open-mode "{value}": use append or truncate')


def partition(value: str | None) -> str | None:
    """``-p``: one partition name (a list is refused); None for the default partition."""
    if value is not None and "," in value:
        raise CliError(f"--partition={value}: a list of partitions is not supported by Corral yet")
    return value or None


def qos(value: str | None) -> str | None:
    """``-q``/``--qos``: the QOS name, None when not given; a blank one is refused."""
    if value is None:
        return None
    if not value.strip():
        raise CliError("Invalid qos specification: --qos needs a QOS name")
    return value.strip()


def nice(value: str | None) -> int:
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


def time_limit(value: str | None) -> int | None:
    """``-t``: the time limit in seconds; None when not given (or unlimited)."""
    return None if value is None else parse_time_limit(value, "--time")


def warn_signal(value: str | None) -> WarnSignal | None:
    """``--signal=[{R|B}:]SIG[@T]``: the warning signal before the time limit."""
    if value is None:
        return None
    sig = parse_signal_option(value, "--signal")
    return WarnSignal(signum=sig.signum, seconds_before=sig.seconds_before, batch_only=sig.batch_only)


def dependencies(value: str | None) -> Dependencies | None:
    """``-d``: the dependency list, None when not given."""
    return None if value is None else parse_dependency(value, "--dependency")


def array(value: str | None) -> ArraySpec | None:
    """``-a``/``--array``: the array's indices and throttle, None when not given."""
    return None if value is None else parse_array(value, "--array")


def begin(value: str | None, now: float | None) -> float | None:
    """``-b``/``--begin``: the Unix time the job becomes eligible, relative to ``now`` (the clock if None)."""
    if value is None:
        return None
    return parse_begin_time(value, time.time() if now is None else now, "--begin")


def switches(value: str | None) -> tuple[int | None, int | None]:
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


def segment(value: str | None, nodes: int) -> int | None:
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


def requeue(options: ParsedArgs) -> bool:
    """``--requeue``/``--no-requeue``: the last one given wins; requeueable when neither is."""
    choice = True
    for key, _ in options.values:
        if key in ("requeue", "no-requeue"):
            choice = key == "requeue"
    return choice
