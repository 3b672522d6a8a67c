"""The kill sequence of a supervisor (slurmstepd's): one for the batch script and for srun's tasks.

Whoever ends a run or a step (a cancel, a requeue, a preemption, a time limit, srun's kill) asks the
supervisor, not the processes: ``request`` writes ``<dir>/kill`` (the grace, in seconds) and sends the
supervisor SIGTERM. The supervisor then, once:

1. sends SIGCONT and SIGTERM to every process it supervises: each task's process group and, for a batch
   script in a memory cgroup, every process in that cgroup (srun's tasks on the batch node included);
2. after the grace, sends SIGKILL to what is left;

and, while the grace runs, it neither kills what a task left behind nor removes the cgroup: a process that
traps SIGTERM to write a checkpoint gets the whole grace, on every node and whatever its parent did. The
sequence runs in the supervisor (timed by SIGALRM), so it goes on if the agent stops in the middle of it.

Built-in modules only: a step's supervisor pays for every module it imports, at every srun.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half, without enum
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: The file in the supervisor's directory that asks for the kill sequence: the grace, in seconds.
KILL_FILE = "kill"
#: Seconds between looks at what is left, while the grace runs.
POLL_S = 0.05


def request(directory: str, grace: float, supervisor_pid: int) -> bool:
    """Ask the supervisor of ``directory`` for its kill sequence with ``grace`` seconds; False if it could not
    be signalled (gone). Asking again changes nothing: a supervisor runs its sequence once."""
    tmp = os.path.join(directory, KILL_FILE + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{max(grace, 0.0):g}\n")
    os.replace(tmp, os.path.join(directory, KILL_FILE))
    try:
        os.kill(supervisor_pid, _signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def requested(directory: str) -> float | None:
    """The grace of the kill sequence asked for in ``directory`` (None: none was)."""
    try:
        with open(os.path.join(directory, KILL_FILE)) as fh:
            return float(fh.read().strip() or 0)
    except (OSError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    """Whether a process group has a member that is not a zombie (a zombie holds nothing, does nothing)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class KillSequence:
    """A supervisor's kill sequence over the process groups (and cgroup members) it names."""

    def __init__(
        self,
        directory: str,
        groups: Callable[[], list[int]],
        members: Callable[[], list[int]] | None = None,
    ) -> None:
        self.directory = directory  # where the request comes in
        self.groups = groups  # process groups to signal, now
        self.members = members or list  # further processes to signal (a cgroup's), now
        self.started = False  # SIGTERM was sent
        self.expired = False  # the grace is over: SIGKILL was sent

    def install(self) -> None:
        """Run the sequence on SIGTERM (the request), and end its grace on SIGALRM."""
        _signal.signal(_signal.SIGTERM, self._on_request)
        _signal.signal(_signal.SIGALRM, self._on_grace_over)

    def _on_request(self, signum: int, frame: Any) -> None:
        self.start()

    def _on_grace_over(self, signum: int, frame: Any) -> None:
        self.expired = True
        self.send(_signal.SIGKILL)

    def start(self) -> None:
        """SIGCONT and SIGTERM to everything now; SIGKILL after the grace asked for (once)."""
        if self.started:
            return
        self.started = True
        grace = requested(self.directory) or 0.0
        self.send(_signal.SIGCONT)
        self.send(_signal.SIGTERM)
        if grace > 0:
            _signal.setitimer(_signal.ITIMER_REAL, grace)
        else:
            self._on_grace_over(_signal.SIGALRM, None)

    def send(self, signum: int) -> None:
        """Send ``signum`` once to every process group and to every member outside those groups: a process
        in both (the batch shell is in its group and in the cgroup) must not get it twice, or a shell that
        traps SIGTERM runs its trap twice when the second arrives after it handled the first."""
        groups = self.groups()
        for pgid in groups:
            try:  # noqa: SIM105 (contextlib is an import too many for stepd)
                os.killpg(pgid, signum)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in self.members():
            try:
                if os.getpgid(pid) not in groups:
                    os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def alive(self) -> bool:
        """Whether anything it signals is still there."""
        return any(group_alive(g) for g in self.groups()) or bool(self.members())

    def wait_out(self) -> None:
        """Once the supervised leaders ended: while the sequence's grace runs, wait for what they left to end
        (or for the grace to end, when SIGKILL takes it). Nothing to wait for without a sequence."""
        while self.started and not self.expired and self.alive():
            time.sleep(POLL_S)
        if self.started and not self.expired:
            _signal.setitimer(_signal.ITIMER_REAL, 0)  # all gone before the grace ended
