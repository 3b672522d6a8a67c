"""The per-step supervisor (slurmstepd for srun's tasks): runs one node's tasks of one step, outliving the
agent.

The agent starts one per (job, attempt, step) on each node that has tasks of the step, detached (its own
session), stdlib-only and run by file path with ``python -I -S``, so neither the job's environment nor the
agent's packages can break it, and an agent restart or upgrade does not touch the tasks. It:

1. reads ``<step dir>/step.json`` (0600, written by the agent: ``stepdir.StepSpec``): each task's argv,
   working directory, environment and output files (the ``-o/-e`` files, else spool files in the step
   directory that the agent tails), and the run's memory cgroup, if any;
2. starts each task in its own session (its process group is what signals target); a task joins the
   cgroup between fork and exec (``corral.libs.memcg``); task 0 gets the descriptor named on the command
   line as its stdin (a pipe the agent feeds with srun's stdin), the others ``/dev/null``; a task that
   cannot be started gets its exit file at once (exit code 2 and why);
3. writes ``pids`` (its own pid and start ticks, each task's pid and start ticks), then answers ``ok`` on
   stdout: the agent's launch handshake;
4. waits; as each task ends, kills what it left in its session and writes ``exit.<task>`` atomically
   (``{"exit_code", "signal", "error"}``), then says ``exit <task>`` on stdout so that a listening agent
   looks at once (an agent that is gone is not an error: a restarted one finds the files);
5. exits when every task has ended.

Usage: ``python -I -S stepd.py STEP_DIR [STDIN_FD]``
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
from types import ModuleType
from typing import IO, Any

#: Files of a step directory (``stepdir.py`` names them for the agent).
SPEC_FILE = "step.json"
PIDS_FILE = "pids"
EXIT_PREFIX = "exit."


def load_lib(name: str) -> ModuleType:
    """``corral.libs.<name>`` by file path (``-I`` puts no package on the path)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.normpath(os.path.join(here, "..", "..", "libs", f"{name}.py"))
    spec = importlib.util.spec_from_file_location(f"corral_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up in sys.modules
    spec.loader.exec_module(module)
    return module


def write_atomically(path: str, data: dict[str, Any]) -> None:
    """Write a JSON file by rename, so a reader sees all of it or nothing. Not fsynced: these files only
    outlive the agent, not the machine (a crash of the machine ends the tasks too)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def open_output(target: dict[str, Any]) -> int:
    """A task's output file (``{"path", "append"}``), its directory created if missing."""
    path = target["path"]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if target.get("append") else os.O_TRUNC)
    return os.open(path, flags, 0o644)


def start_error(exc: OSError, task: dict[str, Any]) -> str:
    """Slurm's words for a task that could not be started."""
    if exc.filename == task["cwd"]:
        return f"chdir({task['cwd']}): {exc.strerror}"
    if exc.filename and exc.filename in (task["stdout"]["path"], (task.get("stderr") or {}).get("path")):
        return f"open({exc.filename}): {exc.strerror}"
    return f"execve(): {task['argv'][0]}: {exc.strerror}"


def start_task(
    task: dict[str, Any], stdin_fd: int | None, procs_fd: int | None, memcg: ModuleType | None
) -> subprocess.Popen[bytes]:
    """Start one task in its own session; OSError if it cannot be."""
    fds: list[int] = []
    try:
        out = open_output(task["stdout"])
        fds.append(out)
        err = out
        if task.get("stderr"):
            err = open_output(task["stderr"])
            fds.append(err)
        confine = None
        if procs_fd is not None and memcg is not None:
            # Its memory is the run's from its first instruction; a task starts even if it cannot join.
            confine = functools.partial(memcg.join_self_quietly, procs_fd)
        return subprocess.Popen(
            task["argv"],
            cwd=task["cwd"],
            env=task["env"],
            stdin=stdin_fd if task.get("stdin") and stdin_fd is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=confine,
        )
    finally:
        for fd in fds:
            os.close(fd)


def say(out: IO[str], line: str) -> None:
    """Tell the agent (if it still listens)."""
    with contextlib.suppress(OSError, ValueError):
        out.write(line + "\n")
        out.flush()


def main(argv: list[str]) -> int:
    """Start the tasks, hand over, wait for each, record its exit."""
    step_dir = argv[0]
    stdin_fd = int(argv[1]) if len(argv) > 1 else None
    procstat = load_lib("procstat")
    try:
        with open(os.path.join(step_dir, SPEC_FILE)) as fh:
            spec = json.load(fh)
    except (OSError, ValueError) as exc:
        say(sys.stdout, f"error cannot read the step: {exc}")
        return 1
    cgroup = spec.get("cgroup")
    memcg = load_lib("memcg") if cgroup else None
    procs_fd = None
    if memcg is not None:
        with contextlib.suppress(OSError):
            procs_fd = memcg.open_procs(cgroup)
    running: dict[int, int] = {}  # pid -> task
    # Kept referenced: a collected Popen may reap its child (subprocess._cleanup), taking its status from
    # our os.wait().
    procs: list[subprocess.Popen[bytes]] = []
    pids: dict[str, list[int]] = {}
    for task in spec["tasks"]:
        try:
            proc = start_task(task, stdin_fd, procs_fd, memcg)
        except OSError as exc:
            write_atomically(
                os.path.join(step_dir, f"{EXIT_PREFIX}{task['task']}"),
                {"exit_code": 2, "signal": 0, "error": start_error(exc, task)},
            )
            continue
        procs.append(proc)
        running[proc.pid] = task["task"]
        pids[str(task["task"])] = [proc.pid, procstat.start_ticks(proc.pid) or 0]
    # Task 0 holds srun's stdin now: our copy would keep it from seeing end of file when the agent closes.
    for fd in (stdin_fd, procs_fd):
        if fd is not None:
            os.close(fd)
    write_atomically(
        os.path.join(step_dir, PIDS_FILE),
        {"stepd": [os.getpid(), procstat.start_ticks("self") or 0], "tasks": pids},
    )
    say(sys.stdout, "ok")
    while running:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        task_id = running.pop(pid, None)
        if task_id is None:
            continue
        # What the task left in its session goes with it (Slurm kills a step's leftovers too).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        code = os.waitstatus_to_exitcode(status)
        write_atomically(
            os.path.join(step_dir, f"{EXIT_PREFIX}{task_id}"),
            {"exit_code": max(code, 0), "signal": -code if code < 0 else 0, "error": ""},
        )
        say(sys.stdout, f"exit {task_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
