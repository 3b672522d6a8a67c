"""The entry points of the Slurm commands (``sbatch``, ``squeue``, …): each starts its command with less.

submitit and dask spawn these commands by the thousand, and most of a command's wall time is Python loading
modules. One load is avoidable: msgspec imports typing_extensions (which imports inspect, ast, dis and
tokenize) only for its ``get_type_hints``, and falls back on ``typing``'s when the import fails, as it does
where typing_extensions is not installed. On Python 3.11+ ``typing`` handles everything Corral's schemas use.
So a command process blocks that import before it loads anything else: ``None`` in ``sys.modules`` makes
``import typing_extensions`` raise ImportError, the import system's documented way of blocking a module. That
is 10-15 ms of a ~90 ms command here (``bench/RESULTS.md``).

Only here, in the commands' own processes: ``corral`` and the services load OpenTelemetry, which needs
typing_extensions. A process that has loaded it already (a test importing ``main``) keeps it.
"""

import sys

# typing's TYPE_CHECKING without loading typing (nor collections, nor __future__): see cmdclient
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

#: The commands started here: each is the module ``corral.cli.<name>`` with a ``main() -> int``.
COMMANDS = (
    "sbatch",
    "squeue",
    "scancel",
    "sacct",
    "sreport",
    "sinfo",
    "scontrol",
    "sprio",
    "sshare",
    "srun",
    "salloc",
)


def load(command: str) -> "Callable[[], int]":
    """Import ``corral.cli.<command>`` with typing_extensions blocked; its ``main``."""
    sys.modules.setdefault("typing_extensions", None)  # type: ignore[arg-type]
    module = f"corral.cli.{command}"
    __import__(module)
    main: Callable[[], int] = sys.modules[module].main
    return main


#: The commands a command server runs for its user (``cmdclient``, ``cmdserver``): the quick request/answer
#: ones. srun and salloc, long-lived and interactive, always run in a process of their own.
SERVED = ("sbatch", "squeue", "scancel", "sacct", "sreport", "sinfo", "scontrol", "sprio", "sshare")


def _run(command: str) -> int:
    if command in SERVED:
        from corral.cli import cmdclient

        status = cmdclient.served(command)
        if status is not None:
            cmdclient.leave(status)
    return int(load(command)())


def sbatch() -> int:
    return _run("sbatch")


def squeue() -> int:
    return _run("squeue")


def scancel() -> int:
    return _run("scancel")


def sacct() -> int:
    return _run("sacct")


def sinfo() -> int:
    return _run("sinfo")


def scontrol() -> int:
    return _run("scontrol")


def sprio() -> int:
    return _run("sprio")


def sshare() -> int:
    return _run("sshare")


def sreport() -> int:
    return _run("sreport")


def srun() -> int:
    return _run("srun")


def salloc() -> int:
    return _run("salloc")
