"""squeue's row order (``-S``/``--sort``, Slurm's keys), pure.

Slurm sorts by ``P,t,-p`` unless told otherwise (``S`` with ``--start``): partition, then the compact state
as a string (so ``CA CD CF CG F NF OOM PD R TO``: pending before running, and with ``-t all`` the ended
jobs in that order), then priority, highest first. Keys apply as successive stable sorts from the last to
the first, so the first key is the primary one; ties keep job id order. ``-`` before a key reverses it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from corral.cli.errors import CliError
from corral.cli.fields import state_code

if TYPE_CHECKING:
    from corral.schemas.api import JobInfo

#: Slurm's default job order.
DEFAULT_SORT = "P,t,-p"
#: The order with ``--start``: by expected start time.
START_SORT = "S"

_Key = Callable[["JobInfo", float], Any]


def _start(job: JobInfo, now: float) -> float:
    """Slurm's start-time key: a job with no start sorts just after now, a pending one due in the past at
    now."""
    if job.start_time is None:
        return now + 100
    return now if job.state == "PENDING" and job.start_time < now else job.start_time


def _used(job: JobInfo, now: float) -> float:
    if job.start_time is None:
        return 0.0
    return (job.end_time if job.end_time is not None else now) - job.start_time


def _limit(job: JobInfo) -> float:
    return math.inf if job.time_limit_s is None else job.time_limit_s


KEYS: dict[str, _Key] = {
    "i": lambda j, now: (j.array_job_id or j.job_id, j.array_task_id or 0),
    "j": lambda j, now: j.name,
    "t": lambda j, now: state_code(j.state),
    "T": lambda j, now: j.state,
    "p": lambda j, now: j.priority,
    "Q": lambda j, now: j.priority,
    "P": lambda j, now: j.partition,
    "u": lambda j, now: j.user,
    "a": lambda j, now: j.account,
    "q": lambda j, now: j.qos,
    "V": lambda j, now: j.submit_time,
    "S": _start,
    "e": lambda j, now: math.inf if j.end_time is None else j.end_time,
    "M": _used,
    "l": lambda j, now: _limit(j),
    "L": lambda j, now: _limit(j) - _used(j, now),
    "D": lambda j, now: j.num_nodes,
    "C": lambda j, now: j.num_cpus,
    "m": lambda j, now: j.min_memory_mb or 0,
    "N": lambda j, now: j.node_list,
    "r": lambda j, now: j.reason,
}


def parse_sort(text: str) -> list[tuple[str, bool]]:
    """``-S`` as (key, reversed) pairs, primary first; CliError naming the key Slurm would refuse."""
    keys: list[tuple[str, bool]] = []
    reverse = False
    for char in text:
        if char in ",+":
            reverse = False
        elif char == "-":
            reverse = True
        elif char in KEYS:
            keys.append((char, reverse))
            reverse = False
        else:
            known = " ".join(sorted(KEYS, key=str.lower))
            raise CliError(f"Invalid sort specification: {char} (use keys among {known}, e.g. -S P,t,-p)")
    return keys


def sort_jobs(jobs: Sequence[JobInfo], keys: list[tuple[str, bool]], now: float) -> list[JobInfo]:
    """``jobs`` in the order of ``keys`` (see ``parse_sort``)."""
    rows = sorted(jobs, key=lambda job: job.job_id)
    for key, reverse in reversed(keys):
        get = KEYS[key]
        rows.sort(key=lambda job: get(job, now), reverse=reverse)
    return rows
