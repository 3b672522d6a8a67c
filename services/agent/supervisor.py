"""The per-run supervisor (Slurm's slurmstepd role): runs one batch script and records how it ended.

The agent starts it detached, in its own session, so it outlives the agent (an agent restart or upgrade
loses no job). It is stdlib-only and run by file path with ``python -I``, so the job's environment
(``PYTHONPATH``, a venv) cannot break it. It:

1. starts the script in its own process group (the job's processes: what signals and kills target), in
   the submit directory, with the environment it was given, stdin from /dev/null and stdout/stderr to
   the inherited descriptors named on its command line;
2. writes the script's pid (= its process group id) on stdout and closes it: the agent's launch
   handshake (``error <why>`` instead when the script cannot be started);
3. (before 2) writes ``<run dir>/pids``; then waits for the script, kills what it left in its process
   group, and writes the exit status to ``<run dir>/status`` atomically (write + fsync + rename): the
   agent reads it, now or after a restart.

Usage: ``python -I supervisor.py RUN_DIR STDOUT_FD STDERR_FD WORKDIR SCRIPT [ARGS...]``
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

#: The status file's name in the run directory.
STATUS_FILE = "status"
#: The file naming the run's processes: ``SUPERVISOR_PID SUPERVISOR_START_TICKS SCRIPT_PID``.
PIDS_FILE = "pids"


def oom_kills(events_text: str) -> int:
    """The ``oom_kill`` count of a cgroup v2 ``memory.events`` file (0 if absent)."""
    for line in events_text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def own_cgroup_oom_kills() -> int | None:
    """OOM kills in this process's cgroup v2, if the run has a cgroup of its own; None when unknown.

    A run has its own cgroup when its supervisor was placed in one by the node's service manager
    (``CORRAL_JOB_CGROUP=1``, e.g. systemd-run --scope); otherwise the count would mix other processes'
    kills, so OOM is not reported (a SIGKILL alone does not prove it).
    """
    if os.environ.get("CORRAL_JOB_CGROUP") != "1":
        return None
    try:
        with open("/proc/self/cgroup") as fh:
            line = next((x for x in fh.read().splitlines() if x.startswith("0::")), None)
        if line is None:
            return None
        with open(f"/sys/fs/cgroup{line[3:]}/memory.events") as fh:
            return oom_kills(fh.read())
    except OSError:
        return None


def write_status(run_dir: str, status: dict[str, object]) -> None:
    """Write the status file atomically and durably."""
    tmp = os.path.join(run_dir, STATUS_FILE + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(status, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(run_dir, STATUS_FILE))


def start_ticks(pid: int | str) -> int | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22); None if it is gone
    or a zombie. With the pid it names one process lifetime (pids are reused)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def write_pids(run_dir: str, script_pid: int) -> None:
    """Record who runs the job (supervisor pid, its start ticks, script pid = pgid) before the handshake,
    so an agent that dies before it records the handshake still finds the run."""
    tmp = os.path.join(run_dir, PIDS_FILE + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{os.getpid()} {start_ticks('self') or 0} {script_pid}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(run_dir, PIDS_FILE))


def main(argv: list[str]) -> int:
    """Run the script, hand its pid to the agent, wait, record the status."""
    run_dir, out_fd, err_fd, workdir, script, *args = argv
    oom_before = own_cgroup_oom_kills()
    try:
        proc = subprocess.Popen(
            [script, *args],
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=int(out_fd),
            stderr=int(err_fd),
            process_group=0,
        )
    except OSError as exc:
        sys.stdout.write(f"error cannot execute the batch script: {exc.strerror}\n")
        sys.stdout.flush()
        return 1
    finally:
        os.close(int(out_fd))
        if err_fd != out_fd:
            os.close(int(err_fd))
    write_pids(run_dir, proc.pid)
    sys.stdout.write(f"{proc.pid}\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    code = proc.wait()
    # What the script left in its process group goes with it (Slurm kills a step's leftovers too).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    oom_after = own_cgroup_oom_kills()
    oom = oom_before is not None and oom_after is not None and oom_after > oom_before
    write_status(
        run_dir,
        {"exit_code": code if code >= 0 else 0, "signal": -code if code < 0 else 0, "oom": oom},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
