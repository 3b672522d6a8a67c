"""The per-run supervisor (Slurm's slurmstepd role): runs one batch script and records how it ended.

The agent starts it detached, in its own session, so it outlives the agent (an agent restart or upgrade
loses no job). It is stdlib-only and run by file path with ``python -I -S``, so the job's environment
(``PYTHONPATH``, a venv) cannot break it. It:

1. starts the script in its own process group (the job's processes: what signals and kills target), in
   the submit directory, with the environment it was given, stdin from /dev/null and stdout/stderr to
   the inherited descriptors named on its command line;
2. writes the script's pid (= its process group id) on stdout and closes it: the agent's launch
   handshake (``error <why>`` instead when the script cannot be started);
3. (before 2) writes ``<run dir>/pids``; then waits for the script, kills what it left in its process
   group, and writes the exit status to ``<run dir>/status`` atomically (write + fsync + rename): the
   agent reads it, now or after a restart;
4. on SIGTERM (the agent's request, ``killseq.py``) runs the kill sequence: SIGCONT + SIGTERM to the
   script's process group and every process of its cgroup, SIGKILL after the grace; leftovers and the
   cgroup wait for the grace to end before they go.

With ``--cgroup=PATH`` (a memory cgroup the agent made for the run, ``memcg.py``) the script joins
it between fork and exec, so it and everything it forks are confined from the start; the supervisor stays
outside (the OOM killer cannot take it, and it can remove the cgroup). After the script: every process
left in the cgroup is killed, the OOM kill count is compared with the one at start (``oom``), the peak
usage is read (``peak_bytes``), and the cgroup is removed, all before the status is written.

Usage: ``python -I -S supervisor.py [--cgroup=PATH] RUN_DIR STDOUT_FD STDERR_FD WORKDIR SCRIPT [ARGS...]``
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

#: The status file's name in the run directory.
STATUS_FILE = "status"
#: The file naming the run's processes: ``SUPERVISOR_PID SUPERVISOR_START_TICKS SCRIPT_PID``.
PIDS_FILE = "pids"


def load_lib(name: str) -> ModuleType:
    """The agent's module ``<name>`` beside this file (stdlib-only like this file; ``-I`` puts no package on
    the path)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"corral_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # A dataclass looks its module up in sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def load_memcg() -> ModuleType:
    """``corral.services.agent.memcg`` loaded by file path."""
    return load_lib("memcg")


#: ``corral.services.agent.procstat.start_ticks``: a process's start time (None: gone or a zombie).
start_ticks: Callable[[int | str], int | None] = load_lib("procstat").start_ticks


def write_status(run_dir: str, status: dict[str, object]) -> None:
    """Write the status file atomically and durably."""
    tmp = os.path.join(run_dir, STATUS_FILE + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(status, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(run_dir, STATUS_FILE))


def write_pids(run_dir: str, script_pid: int) -> None:
    """Record who runs the job (supervisor pid, its start ticks, script pid = pgid) before the handshake,
    so an agent that dies before it records the handshake still finds the run."""
    tmp = os.path.join(run_dir, PIDS_FILE + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(f"{os.getpid()} {start_ticks('self') or 0} {script_pid}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(run_dir, PIDS_FILE))


def start_confined(cgroup: str, memcg: ModuleType) -> tuple[int | None, Callable[[], None] | None]:
    """(descriptor on the cgroup's procs file, Popen's preexec_fn) to start the script in ``cgroup``;
    (None, None) when the cgroup cannot be joined (the run goes on unconfined)."""
    try:
        fd: int = memcg.open_procs(cgroup)
    except OSError:
        return None, None
    return fd, functools.partial(memcg.join_self, fd)


def end_confined(cgroup: str, memcg: ModuleType, oom_before: int | None) -> dict[str, object]:
    """Read what the run's cgroup tells, then remove it, killing what is left in it (leftovers that escaped
    the process group, setsid or a double fork, still belong to the run): the status's cgroup part."""
    oom_after = memcg.oom_count(cgroup)
    peak = memcg.peak_bytes(cgroup)
    memcg.remove(cgroup)
    status: dict[str, object] = {
        "oom": oom_before is not None and oom_after is not None and oom_after > oom_before
    }
    if peak is not None:
        status["peak_bytes"] = peak
    return status


def popen_script(
    script: str, args: list[str], workdir: str, out_fd: str, err_fd: str, confine: Callable[[], None] | None
) -> subprocess.Popen[bytes]:
    """Start the batch script in its own process group (``confine``: joins its cgroup before exec), with every
    signal at its default action (``sigreset.py``: even one the agent was started with ignored)."""
    sigreset = load_lib("sigreset")

    def before_exec() -> None:
        sigreset.reset_for_exec()
        if confine is not None:
            confine()

    return subprocess.Popen(
        [script, *args],
        cwd=workdir,
        stdin=subprocess.DEVNULL,
        stdout=int(out_fd),
        stderr=int(err_fd),
        process_group=0,
        preexec_fn=before_exec,
    )


def main(argv: list[str]) -> int:
    """Run the script, hand its pid to the agent, wait, record the status."""
    cgroup = argv.pop(0).removeprefix("--cgroup=") if argv and argv[0].startswith("--cgroup=") else None
    run_dir, out_fd, err_fd, workdir, script, *args = argv
    memcg = load_memcg() if cgroup else None
    # The kill sequence (killseq.py) is ready before the script exists: the agent may ask for it at once.
    group: list[int] = []
    killing = load_lib("killseq").KillSequence(
        run_dir, lambda: group, (lambda: memcg.members(cgroup)) if memcg is not None and cgroup else None
    )
    killing.install()
    procs_fd, confine = (None, None) if memcg is None or cgroup is None else start_confined(cgroup, memcg)
    oom_before = None if procs_fd is None or memcg is None else memcg.oom_count(cgroup)
    try:
        try:
            proc = popen_script(script, args, workdir, out_fd, err_fd, confine)
        except subprocess.SubprocessError:
            # The script could not join its cgroup: it runs unconfined, and its OOM is unknown.
            oom_before = None
            proc = popen_script(script, args, workdir, out_fd, err_fd, None)
    except OSError as exc:
        sys.stdout.write(f"error cannot execute the batch script: {exc.strerror}\n")
        sys.stdout.flush()
        return 1
    finally:
        os.close(int(out_fd))
        if err_fd != out_fd:
            os.close(int(err_fd))
        if procs_fd is not None:
            os.close(procs_fd)
    group.append(proc.pid)
    write_pids(run_dir, proc.pid)
    # The handshake. An agent that died meanwhile reads nothing (EPIPE): the script runs on, and the next
    # agent finds it through the pids file written above.
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.write(f"{proc.pid}\n")
        sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    code = proc.wait()
    # In a kill sequence, what the script left (in its process group, in its cgroup: srun's tasks here) has
    # the rest of the grace; then, or at once when the script ended on its own, it goes with the script
    # (Slurm kills a step's leftovers too).
    killing.wait_out()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    status: dict[str, object] = {
        "exit_code": code if code >= 0 else 0,
        "signal": -code if code < 0 else 0,
        "oom": False,
    }
    if memcg is not None and cgroup is not None:
        status.update(end_confined(cgroup, memcg, oom_before))
    write_status(run_dir, status)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
