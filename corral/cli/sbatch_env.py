"""The environment a job gets from sbatch's ``--export``, bounded in size and without the submitter's own
job identity (inherited ``SLURM_*``/``SBATCH_*`` variables). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from corral.cli.errors import CliError

#: Largest exported environment, in bytes of ``NAME=value`` entries.
MAX_ENVIRONMENT_BYTES = 1024 * 1024
#: Variables never inherited by a job: a job submitted from inside a job must not carry its parent's identity.
INHERITED_PREFIXES_DROPPED = ("SLURM_", "SBATCH_")
#: A shell variable name, as ``--export`` may name one.
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
