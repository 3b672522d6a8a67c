"""The signal dispositions a job's processes start with: the defaults, whatever the agent inherited.

An ignored signal stays ignored across exec, and a non-interactive shell cannot trap a signal that was
ignored when it started (POSIX). So an agent started under ``nohup`` (SIGHUP ignored) would start every
job with SIGHUP ignored: ``trap ... HUP`` in a batch script would do nothing and ``scancel -s HUP`` would
reach nothing. Slurm's slurmstepd resets every signal before it starts a task; so does the supervisor
of every step, the batch script's included (``stepd.py``), in the forked child, before exec.

Built-in modules only: ``stepd.py`` loads it by path and pays for every import.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half, without enum


def reset_for_exec() -> None:
    """In a forked child about to exec a job's process: every ignored signal back to its default action, and
    none blocked. (Handlers are reset by exec anyway; only ignored dispositions and the mask stay.)"""
    for signum in range(1, _signal.NSIG):
        if signum in (_signal.SIGKILL, _signal.SIGSTOP):
            continue
        try:
            if _signal.getsignal(signum) == _signal.SIG_IGN:
                _signal.signal(signum, _signal.SIG_DFL)
        except (OSError, ValueError):
            continue  # not a signal this system has
    _signal.pthread_sigmask(_signal.SIG_SETMASK, [])
