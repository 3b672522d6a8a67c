"""How a step's supervisor (``stepd.py``) starts one task: fork, then in the child a session, its
``SLURM_TASK_PID`` (its own pid, which its exec keeps) and a step task's umask (srun's ``SLURM_UMASK``, as
slurmstepd applies it), the cgroup, the signals at their defaults, the job owner's identity, the output
files opened as them, the working directory, exec. Stdlib-only and imported by file path, as the
supervisor's other modules.

The identity goes in the only order that works, for good: supplementary groups and gid while still root,
the uid last. The ``-o/-e`` files are opened after it, as the owner (Slurm's slurmstepd opens them as the
user too): a file or directory the owner may not write is the task's start error, never a file made by
root. The step directory's spool files, which only the supervisor may enter, are opened by it before the
fork. The PATH search is our own: ``os.execvpe`` imports ``warnings``, which a task that became its owner
may not be able to read (an interpreter under a home they cannot enter).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

#: How the batch step's output file that cannot be opened is named (the job's Reason; runner.py passes it on).
OUTPUT_ERROR = "cannot open output file"


def open_output(target: dict[str, Any], batch: bool = False) -> int:
    """A task's output file (``{"path", "append"}``), its directory created if missing: in the task, as its
    user, for the ``-o/-e`` files (Slurm's slurmstepd opens them as the user too). OSError in Slurm's words
    (srun's ``open(path): why``; for the batch script the Reason, naming the path at fault)."""
    path = target["path"]
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if target.get("append") else os.O_TRUNC)
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return os.open(path, flags, 0o644)
    except OSError as exc:
        if not batch:
            raise OSError(exc.errno, f"open({path}): {exc.strerror}") from None
        where = exc.filename if isinstance(exc.filename, str) else path
        if isinstance(exc, FileExistsError):
            why = f"{where} is not a directory"  # makedirs of a parent that exists as a file
        else:
            strerror = exc.strerror or type(exc).__name__
            why = strerror if where == path else f"{strerror}: {where}"
        raise OSError(exc.errno, f"{OUTPUT_ERROR} {path}: {why}") from None


def start_error(phase: str, err: int, task: dict[str, Any], run_as: dict[str, Any] | None) -> str:
    """Slurm's words for a task that could not be started."""
    why = os.strerror(err)
    if phase == "chdir":
        return f"chdir({task['cwd']}): {why}"
    if phase == "user" and run_as is not None:
        return f"cannot run as uid {run_as['uid']} gid {run_as['gid']}: {why}"
    return f"execve(): {task['argv'][0]}: {why}"


def set_umask(text: str) -> None:
    """A step's tasks run with srun's umask (its SLURM_UMASK, octal), as slurmstepd applies it; a value that
    is not one leaves the supervisor's."""
    try:  # noqa: SIM105 (contextlib is an import too many here)
        os.umask(int(text, 8) & 0o777)
    except ValueError:
        pass


def become(run_as: dict[str, Any]) -> None:
    """Take the job owner's identity for good, in the order that works: supplementary groups and gid while
    still root, the uid last (after it nothing can be changed back)."""
    os.setgroups(run_as["groups"])
    os.setgid(run_as["gid"])
    os.setuid(run_as["uid"])


def execute(argv: list[str], env: dict[str, str]) -> None:
    """``execvpe``, searching the task's ``PATH``, without its imports: ``os.get_exec_path`` imports
    ``warnings``, which a task that has become its owner may not be able to read (an interpreter in a home
    they cannot enter). The first error other than "not there" wins, as in ``execvpe``."""
    command = argv[0]
    if "/" in command:
        os.execve(command, argv, env)
    first: OSError | None = None
    last: OSError | None = None
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        try:
            os.execve(os.path.join(folder or ".", command), argv, env)
        except (FileNotFoundError, NotADirectoryError) as exc:
            last = exc
        except OSError as exc:
            last = exc
            first = first or exc
    raise first or last or FileNotFoundError(2, os.strerror(2))


def exec_task(
    task: dict[str, Any],
    stdin: int,
    private: dict[str, int],
    procs_fd: int | None,
    report: int,
    sigreset: ModuleType,
    run_as: dict[str, Any] | None,
    batch: bool,
) -> None:
    """In the forked child: join the cgroup, become a session, take the owner's identity, open the output
    files as them, take the descriptors, chdir, exec. Never returns; a failure is written to ``report``
    (``<errno>:<message>``) for the parent."""
    phase = "exec"
    try:
        os.setsid()
        env = task["env"]  # this process's copy: the task's own variables go in it
        env["SLURM_TASK_PID"] = str(os.getpid())
        if not batch:
            set_umask(env.get("SLURM_UMASK", ""))
        if procs_fd is not None:
            # Its memory is the run's from its first instruction; a task starts even if it cannot join.
            try:  # noqa: SIM105 (contextlib is an import too many here)
                os.write(procs_fd, b"0")
            except OSError:
                pass
        # the default action of every signal, even those ignored here (by Python: SIGPIPE, SIGXFSZ; or by
        # an agent started under nohup: SIGHUP), so that the task can trap them
        sigreset.reset_for_exec()
        if run_as is not None:
            phase = "user"
            become(run_as)
        phase = "open"
        out = private["stdout"] if "stdout" in private else open_output(task["stdout"], batch)
        err = out
        if task.get("stderr"):
            err = private["stderr"] if "stderr" in private else open_output(task["stderr"], batch)
        for target, fd in enumerate((stdin, out, err)):
            os.dup2(fd, target)
        phase = "chdir"
        os.chdir(task["cwd"])
        phase = "exec"
        execute(task["argv"], env)
    except OSError as exc:
        why = exc.strerror if phase == "open" else start_error(phase, exc.errno or 0, task, run_as)
        os.write(report, f"{exc.errno or 0}:{why}".encode())
    except BaseException:
        os.write(report, f"0:{start_error(phase, 0, task, run_as)}".encode())
    finally:
        os._exit(127)


def start_task(
    task: dict[str, Any],
    stdin_fd: int | None,
    procs_fd: int | None,
    sigreset: ModuleType,
    run_as: dict[str, Any] | None = None,
    batch: bool = False,
    forked: Callable[[int], None] | None = None,
) -> int:
    """Start one task in its own session, as ``run_as`` if given; its pid. OSError (with Slurm's words) if
    it cannot be. ``forked(pid)`` is called as soon as the child exists, before its exec: a child that
    blocks before it (opening an output FIFO nobody reads, a hung file system) is then known and can be
    killed by whoever gives up on the supervisor."""
    private: dict[str, int] = {}  # spool files of the step directory, which only the supervisor may open
    try:
        for name in ("stdout", "stderr"):
            target = task.get(name)
            if target and target.get("private"):
                private[name] = open_output(target)
    except OSError:
        for fd in private.values():
            os.close(fd)
        raise
    null = None
    if stdin_fd is None or not task.get("stdin"):
        null = os.open(os.devnull, os.O_RDONLY)
    stdin = null if null is not None else stdin_fd
    assert stdin is not None
    # Close-on-exec: it reads end of file once the task's exec succeeded.
    report_r, report_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:
            os.close(report_r)
            exec_task(task, stdin, private, procs_fd, report_w, sigreset, run_as, batch)
    finally:
        for fd in {*private.values(), report_w} | ({null} if null is not None else set()):
            os.close(fd)
    if forked is not None:
        forked(pid)
    with open(report_r, "rb") as report:
        failure = report.read()
    if failure:
        os.waitpid(pid, 0)
        code, _, why = failure.decode(errors="replace").partition(":")
        raise OSError(int(code or 0), why)
    return pid
