"""Process identity from ``/proc`` (stdlib only): a pid alone does not name a process, pids are reused.

The supervisors (``stepd.py``) load this file by path (they run with
``python -I`` and import nothing of corral), so it must stay stdlib-only.
"""

from __future__ import annotations


def start_ticks(pid: int | str) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None if it is gone
    or a zombie. With the pid it names one process lifetime (pids are reused)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def is_running(pid: int, ticks: int) -> bool:
    """The process ``pid`` started at ``ticks`` still runs (not a zombie, not a newer process on that pid)."""
    return pid > 0 and ticks > 0 and start_ticks(pid) == ticks
