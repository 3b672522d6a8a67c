"""The supervisor of every step (slurmstepd): runs one node's tasks of one step, outliving the agent. The
batch script is a step too (``batch``: one task, in its run's directory, which also owns the run's cgroup).

The agent starts one per (job, attempt, step) on each node that has tasks of the step, detached (its own
session), stdlib-only and run by file path with ``python -I -S``, so neither the job's environment nor the
agent's packages can break it, and an agent restart or upgrade does not touch the tasks. It:

1. reads ``<step dir>/step.spec`` (0600, written by the agent: ``stepdir.StepSpec`` marshalled, which
   needs no module to read): each task's argv,
   working directory, environment and output files (the ``-o/-e`` files, else spool files in the step
   directory that the agent tails), and the run's memory cgroup, if any;
2. starts each task in its own session (its process group is what signals target), every signal at its
   default action (``sigreset.py``: one the agent was started with ignored too); a task joins the
   cgroup between fork and exec (writing to its ``cgroup.procs``, as ``memcg.join_self``), then takes
   the job owner's identity (``run_as``: supplementary groups, gid, uid, for good) and opens its ``-o/-e``
   files as them (the spool files of the step directory are the supervisor's, opened before); task
   0 gets the descriptor named on the command
   line as its stdin (a pipe the agent feeds with srun's stdin), the others ``/dev/null``; a task that
   cannot be started gets its exit file at once (exit code 2 and why, with the time it was tried at);
3. writes ``pids`` (its own pid and start ticks, each task's pid and start ticks; again after each task
   it starts, so that the tasks of a supervisor stuck starting the next one can be killed), then answers
   ``ok`` on stdout: the agent's launch handshake;
4. waits; as each task ends, kills what it left in its session and writes ``exit.<task>`` atomically
   (``{"exit_code", "signal", "error", "pid", "started_at", "ended_at"}``: the times are this node's wall
   clock in seconds, taken as the supervisor starts the task and as it reaps it: what the task's span
   is drawn from), then says ``exit <task>`` on stdout so that a listening agent
   looks at once (an agent that is gone is not an error: a restarted one finds the files);
5. exits when every task has ended; the batch step first reads its cgroup's OOM count and peak, removes
   it (killing what is left in it) and writes ``status`` (``{"exit_code", "signal", "oom", "peak_bytes"}``,
   fsynced): what the agent reports of the run, now or after a restart;
6. on SIGTERM (the agent's request, ``killseq.py``, as the batch script's supervisor) runs the kill
   sequence over every task's session: SIGCONT + SIGTERM, SIGKILL after the grace; it exits once the
   sessions are empty, so its end tells the agent that nothing of the step is left here.

Usage: ``python -I -S stepd.py STEP_DIR [STDIN_FD]``
"""

from __future__ import annotations

# Built-in modules only: each module imported costs every srun its share (json and signal pull in re and
# enum, ~20 ms); so the spec is marshalled and the few files written are formatted here.
import _signal  # type: ignore[import-not-found]  # signal's C half, without enum
import marshal
import os
import sys
import time  # built into the interpreter: no file to find and load

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import IO

#: Files of a step directory (``stepdir.py`` names them for the agent).
SPEC_FILE = "step.spec"
PIDS_FILE = "pids"
EXIT_PREFIX = "exit."
#: The batch step's outcome, in its run's directory (``runner.py`` reads it, now or after a restart).
STATUS_FILE = "status"


def write_status(step_dir: str, code: int, signum: int, confined: dict[str, object]) -> None:
    """The batch step's status, atomically and durably (write + fsync + rename): it is what the agent
    reports of the run, even after a crash of the whole node's agent."""
    oom = "true" if confined.get("oom") else "false"
    fields = [f'"exit_code": {code}', f'"signal": {signum}', f'"oom": {oom}']
    if confined.get("peak_bytes") is not None:
        fields.append(f'"peak_bytes": {confined["peak_bytes"]}')
    tmp = os.path.join(step_dir, STATUS_FILE + ".tmp")
    with open(tmp, "w") as fh:
        fh.write("{" + ", ".join(fields) + "}")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, os.path.join(step_dir, STATUS_FILE))


def end_confined(cgroup: str, memcg: ModuleType, oom_before: int | None) -> dict[str, object]:
    """What the batch step's cgroup (the run's, which it owns) tells, then its removal, killing what is left
    in it (leftovers that escaped the task's session, srun's tasks here): the status's cgroup part."""
    oom_after = memcg.oom_count(cgroup)
    peak = memcg.peak_bytes(cgroup)
    memcg.remove(cgroup)
    return {
        "oom": oom_before is not None and oom_after is not None and oom_after > oom_before,
        "peak_bytes": peak,
    }


def load_lib(name: str) -> ModuleType:
    """The agent's module ``<name>`` beside this file (stdlib-only): ``-I`` puts no package on the path, so
    this directory goes at the end of it (the standard library wins any name clash)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.append(here)
    module: ModuleType = __import__(name)
    return module


def write_atomically(path: str, text: str) -> None:
    """Write a file by rename, so a reader sees all of it or nothing. Not fsynced: these files only
    outlive the agent, not the machine (a crash of the machine ends the tasks too)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def exit_json(
    exit_code: int,
    signum: int = 0,
    error: str = "",
    pid: int = 0,
    started_at: float = 0.0,
    ended_at: float = 0.0,
) -> str:
    """An exit file's JSON (``{"exit_code", "signal", "error", "pid", "started_at", "ended_at"}``; pid 0 and
    times 0.0 when unknown)."""
    quoted = '""'
    if error:
        import json  # only for the rare task that cannot start (see the imports above)

        quoted = json.dumps(error)
    # repr of a finite float is valid JSON and round-trips exactly
    return (
        f'{{"exit_code": {exit_code}, "signal": {signum}, "error": {quoted}, "pid": {pid}, '
        f'"started_at": {float(started_at)!r}, "ended_at": {float(ended_at)!r}}}'
    )


def say(out: IO[str], line: str) -> None:
    """Tell the agent (if it still listens)."""
    try:
        out.write(line + "\n")
        out.flush()
    except (OSError, ValueError):
        pass


def main(argv: list[str]) -> int:
    """Start the tasks, hand over, wait for each, record its exit."""
    step_dir = argv[0]
    stdin_fd = int(argv[1]) if len(argv) > 1 else None
    procstat = load_lib("procstat")
    sigreset = load_lib("sigreset")
    taskstart = load_lib("taskstart")
    # Each task's session (= process group) stays signalled by the kill sequence until it is empty.
    groups: list[int] = []
    killing = load_lib("killseq").KillSequence(step_dir, lambda: groups)
    killing.install()
    try:
        with open(os.path.join(step_dir, SPEC_FILE), "rb") as fh:
            spec = marshal.load(fh)
    except (OSError, ValueError, EOFError, TypeError) as exc:
        say(sys.stdout, f"error cannot read the step: {exc}")
        return 1
    if stdin_fd is not None:
        os.set_inheritable(stdin_fd, False)  # for task 0 only (dup2 gives it its own)
    procs_fd = None
    if spec.get("cgroup_procs"):
        try:
            procs_fd = os.open(spec["cgroup_procs"], os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            procs_fd = None  # the tasks run unconfined, as the agent's own runs would
    # The batch step owns its run's cgroup: its kill sequence reaches every process in it (srun's tasks on
    # this node too), and once the script ended it reads the OOM count and the peak, and removes it.
    batch = bool(spec.get("batch"))
    cgroup = os.path.dirname(spec["cgroup_procs"]) if batch and procs_fd is not None else None
    memcg = load_lib("memcg") if cgroup is not None else None
    oom_before = None
    if memcg is not None:
        killing.members = lambda: memcg.members(cgroup)
        oom_before = memcg.oom_count(cgroup)
    running: dict[int, int] = {}  # pid -> task
    started: dict[int, float] = {}  # task -> when it was started (wall clock, s)
    codes: dict[int, tuple[int, int]] = {}  # task -> (exit code, signal)
    pids: list[str] = []
    me = f"[{os.getpid()}, {procstat.start_ticks('self') or 0}]"

    recorded = ""

    def record_pids() -> None:
        nonlocal recorded
        # Only when it changed: the check after the tasks started mostly finds what ``forked`` wrote, and a
        # rewrite is a file created, written and renamed for every job.
        text = f'{{"stepd": {me}, "tasks": {{{", ".join(pids)}}}}}'
        if text != recorded:
            write_atomically(os.path.join(step_dir, PIDS_FILE), text)
            recorded = text

    def forked(pid: int) -> None:
        # recorded before its exec: an agent that gives up on a supervisor stuck starting this task (an
        # output file that blocks, say) kills it with the tasks already running
        pids.append(f'"{task["task"]}": [{pid}, {procstat.start_ticks(pid) or 0}]')
        record_pids()

    for task in spec["tasks"]:
        started[task["task"]] = time.time()
        try:
            pid = taskstart.start_task(task, stdin_fd, procs_fd, sigreset, spec.get("run_as"), batch, forked)
        except OSError as exc:
            if len(pids) > len(running):  # forked, then failed before its exec: it was reaped
                pids.pop()
                record_pids()
            at = started[task["task"]]
            write_atomically(
                os.path.join(step_dir, f"{EXIT_PREFIX}{task['task']}"),
                exit_json(2, 0, exc.strerror or str(exc), 0, at, at),
            )
            continue
        running[pid] = task["task"]
        groups.append(pid)
        if killing.started:
            os.killpg(pid, _signal.SIGTERM)  # asked to stop while it was starting the tasks
    # Task 0 holds srun's stdin now: our copy would keep it from seeing end of file when the agent closes.
    for fd in (stdin_fd, procs_fd):
        if fd is not None:
            os.close(fd)
    record_pids()
    say(sys.stdout, "ok")
    while running:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        task_id = running.pop(pid, None)
        if task_id is None:
            continue
        ended = time.time()
        # What the task left in its session goes with it (Slurm kills a step's leftovers too), at once, or
        # in a kill sequence after the grace (it goes on signalling the session until then).
        if not killing.started:
            try:  # noqa: SIM105 (contextlib is an import too many here)
                os.killpg(pid, _signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            groups.remove(pid)
        code = os.waitstatus_to_exitcode(status)
        codes[task_id] = (max(code, 0), max(-code, 0))
        outcome = exit_json(*codes[task_id], "", pid, started[task_id], ended)
        write_atomically(os.path.join(step_dir, f"{EXIT_PREFIX}{task_id}"), outcome)
        say(sys.stdout, f"exit {task_id}")
    killing.wait_out()
    if killing.started:
        killing.send(_signal.SIGKILL)  # nothing is left, or the grace is over: no leftover stays
    if batch and codes:
        confined = end_confined(cgroup, memcg, oom_before) if memcg is not None and cgroup else {}
        write_status(step_dir, *codes[0], confined)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
