"""Whether a local cluster is running: ``<state>/up.pid``, written by the process that runs it.

A command whose connection is refused retries for ``nats_retry.RETRY_S`` seconds, which rides through a
NATS server the cluster's supervisor restarts. Against a cluster that is not running at all that is ten
seconds of waiting for nothing, so a command that found the local cluster's credentials in its state
directory looks here after a refused connection, and says at once that the cluster is down:

- ``<pid> <start ticks>`` while ``corral up`` (or ``corral demo``, or a test) runs it; a process that is
  gone (killed, the machine rebooted) means the cluster is down;
- ``stopped`` after a clean stop;
- no file: a cluster started by an older Corral; the command retries as before.

Read by every command after a refused connection only: os and the agent's stdlib-only ``procstat``.
"""

from __future__ import annotations

import os

from corral.services.agent.procstat import is_running, start_ticks

#: The file's name in the state directory.
UP_FILE = "up.pid"
STOPPED = "stopped"


def mark_up(state_dir: str | os.PathLike[str]) -> None:
    """This process runs the cluster in ``state_dir`` from now on."""
    _write(state_dir, f"{os.getpid()} {start_ticks(os.getpid()) or 0}\n")


def mark_stopped(state_dir: str | os.PathLike[str]) -> None:
    """The cluster in ``state_dir`` was stopped."""
    _write(state_dir, f"{STOPPED}\n")


def is_down(state_dir: str | os.PathLike[str]) -> bool:
    """The cluster in ``state_dir`` is known not to run (False when it runs or cannot be told)."""
    try:
        with open(os.path.join(state_dir, UP_FILE)) as fh:
            words = fh.read().split()
    except OSError:
        return False
    if words == [STOPPED]:
        return True
    try:
        pid, ticks = (int(word) for word in words)
    except ValueError:
        return False
    return not is_running(pid, ticks)


def _write(state_dir: str | os.PathLike[str], text: str) -> None:
    path = os.path.join(state_dir, UP_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
