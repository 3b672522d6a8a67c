"""The step supervisor (stepd.py) as the agent runs it: a real detached process with real tasks, read back
through the step directory (stepdir.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from corral.services.agent import stepd
from corral.services.agent.stepdir import OutputTarget, RunAs, StepDir, StepSpec, TaskSpec, running

pytestmark = pytest.mark.unit

ENV = {"PATH": os.defpath}


def task(sdir: StepDir, number: int, script: str, stdin: bool = False) -> TaskSpec:
    """A bash task whose output goes to its spool files."""
    return TaskSpec(
        task=number,
        argv=["bash", "-c", script],
        cwd=str(sdir.path),
        env=ENV,
        stdout=OutputTarget(path=str(sdir.spool("out", number))),
        stderr=OutputTarget(path=str(sdir.spool("err", number))),
        stdin=stdin,
    )


def run(
    sdir: StepDir, tasks: list[TaskSpec], stdin: bytes | None = None, run_as: RunAs | None = None
) -> list[str]:
    """Run the supervisor to its end; the lines it said."""
    spec = StepSpec(user="u", key="k", job_id=1, attempt=0, step_id=0, tasks=tasks, run_as=run_as)
    sdir.write_spec(spec)
    argv = [sys.executable, "-I", "-S", stepd.__file__, str(sdir.path)]
    read, write = os.pipe() if stdin is not None else (None, None)
    proc = subprocess.Popen(
        argv + ([str(read)] if read is not None else []),
        stdout=subprocess.PIPE,
        start_new_session=True,
        pass_fds=(read,) if read is not None else (),
    )
    if read is not None and write is not None:
        os.close(read)
        os.write(write, stdin or b"")
        os.close(write)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    return out.decode().splitlines()


@pytest.fixture
def sdir(tmp_path: Path) -> StepDir:
    step = StepDir(tmp_path / "stepd", (1, 0, 0))
    step.create()
    return step


def test_tasks_run_in_sessions_and_their_exits_and_pids_are_recorded(sdir: StepDir) -> None:
    before = time.time()
    lines = run(
        sdir,
        [
            # A leftover in the task's session dies with the task.
            task(sdir, 0, "sleep 300 & echo $! > bg; echo out; echo err >&2; exit 3"),
            task(sdir, 1, "[ $$ = $(ps -o sid= -p $$) ] && echo leader; sleep 1; kill -TERM $$"),
        ],
    )
    assert lines[0] == "ok"
    assert sorted(lines[1:]) == ["exit 0", "exit 1"]
    exits = {t: sdir.exit_of(t, "n1") for t in (0, 1)}
    assert exits[0] is not None and (exits[0].exit_code, exits[0].signal) == (3, 0)
    assert exits[1] is not None and (exits[1].exit_code, exits[1].signal) == (0, 15)
    assert sdir.spool("out", 0).read_text() == "out\n"
    assert sdir.spool("err", 0).read_text() == "err\n"
    assert sdir.spool("out", 1).read_text().strip() == "leader"  # its own session
    pids = sdir.pids()
    assert pids is not None and set(pids.tasks) == {"0", "1"}
    # Each exit names its task's pid and when it ran (task 1 ran a second at least), in wall-clock seconds.
    after = time.time()
    for t, exit in exits.items():
        assert exit is not None and exit.pid == pids.tasks[str(t)][0]
        assert before <= exit.started_at <= exit.ended_at <= after
    assert exits[1] is not None and exits[1].ended_at - exits[1].started_at >= 1.0
    # A live task's pid comes with its start ticks (task 0 may already be a zombie then: 0).
    assert pids.tasks["1"][1] > 0
    assert not running(pids.stepd)  # it ended, so its pid and ticks no longer match
    leftover = int((sdir.path / "bg").read_text())
    deadline = time.monotonic() + 5
    while Path(f"/proc/{leftover}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{leftover}").exists() or "Z" in Path(f"/proc/{leftover}/stat").read_text()


def test_task_zero_gets_the_stdin_pipe_the_others_dev_null(sdir: StepDir) -> None:
    run(sdir, [task(sdir, 0, "cat", stdin=True), task(sdir, 1, "cat")], stdin=b"hello\n")
    assert sdir.spool("out", 0).read_text() == "hello\n"
    assert sdir.spool("out", 1).read_text() == ""


def test_a_task_gets_sigpipe_back(sdir: StepDir) -> None:
    # Python ignores SIGPIPE; a task must not inherit that (``yes`` would complain of a broken pipe).
    run(sdir, [task(sdir, 0, "yes | head -1")])
    assert sdir.spool("out", 0).read_text() == "y\n"
    assert sdir.spool("err", 0).read_text() == ""


@pytest.mark.parametrize(
    ("argv", "cwd", "error"),
    [
        (["/no/such/cmd"], None, "execve(): /no/such/cmd: No such file or directory"),
        (["true"], "/no/such/dir", "chdir(/no/such/dir): No such file or directory"),
    ],
)
def test_a_task_that_cannot_start_gets_an_exit_saying_why(
    sdir: StepDir, argv: list[str], cwd: str | None, error: str
) -> None:
    bad = TaskSpec(
        task=1,
        argv=argv,
        cwd=cwd or str(sdir.path),
        env=ENV,
        stdout=OutputTarget(path=str(sdir.spool("out", 1))),
    )
    lines = run(sdir, [task(sdir, 0, "true"), bad])
    assert lines == ["ok", "exit 0"]
    exit = sdir.exit_of(1, "n1")
    assert exit is not None and (exit.exit_code, exit.error) == (2, error)
    assert exit.pid == 0 and 0 < exit.started_at == exit.ended_at  # never started: when it was tried
    pids = sdir.pids()
    assert pids is not None and set(pids.tasks) == {"0"}


async def test_a_supervisor_stuck_starting_a_task_leaves_none_running(
    sdir: StepDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.services.agent import step_local
    from corral.services.agent.background import Background
    from corral.services.agent.crashpoints import CrashPoints
    from corral.services.agent.identity import Identities
    from corral.services.agent.step_cgroups import StepCgroups
    from corral.services.agent.step_local import StepLocal
    from corral.services.agent.step_output import StepOutput
    from corral.services.agent.step_state import LocalStep, StepTable

    # task 1's output is a FIFO nobody reads: opening it blocks the supervisor after it started task 0
    fifo = sdir.path / "blocked"
    os.mkfifo(fifo)
    blocked = TaskSpec(
        task=1, argv=["true"], cwd=str(sdir.path), env=ENV, stdout=OutputTarget(path=str(fifo))
    )
    spec = StepSpec(
        user="u", key="k", job_id=1, attempt=0, step_id=0, tasks=[task(sdir, 0, "sleep 300"), blocked]
    )
    sdir.write_spec(spec)
    monkeypatch.setattr(step_local, "HANDSHAKE_S", 3.0)
    nc = None  # not used before a handshake
    table, background = StepTable(), Background()
    cgroups = StepCgroups(lambda j, a: None, lambda order: None, lambda j, a: None)
    agent_steps = StepLocal(
        nc=nc,  # type: ignore[arg-type]
        node="n1",
        root=tmp_path,
        kill_wait=1.0,
        table=table,
        cgroups=cgroups,
        output=StepOutput(nc, "n1", table, cgroups, background),  # type: ignore[arg-type]
        crash=CrashPoints(),
        background=background,
        identities=Identities("n1", allow_root_jobs=True),
    )
    local = LocalStep(user="u", key="k", step=(1, 0, 0), tasks=[0, 1], dir=sdir)
    await agent_steps._start_stepd(local, spec)
    pids = sdir.pids()
    # each recorded as soon as it was forked: task 1's process is the one stuck opening its output
    assert pids is not None and set(pids.tasks) == {"0", "1"}
    deadline = time.monotonic() + 5
    while any(running(pids.tasks[t]) for t in "01") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [t for t in "01" if running(pids.tasks[t])] == []  # none is left behind, stuck or not
    for number in (0, 1):
        found = sdir.exit_of(number, "n1")
        assert found is not None and found.error == "the step's supervisor did not answer", found


def test_the_spool_files_are_those_of_tasks_without_output_files(sdir: StepDir) -> None:
    own = TaskSpec(task=1, argv=["true"], cwd="/", env=ENV, stdout=OutputTarget(path="/tmp/step-1.out"))
    mixed = TaskSpec(
        task=2,
        argv=["true"],
        cwd="/",
        env=ENV,
        stdout=OutputTarget(path=str(sdir.spool("out", 2))),
        stderr=OutputTarget(path="/tmp/step-2.err"),
    )
    spec = StepSpec(
        user="u", key="k", job_id=1, attempt=0, step_id=0, tasks=[task(sdir, 0, "true"), own, mixed]
    )
    assert sdir.spooled(spec) == {"out.0", "err.0", "out.2"}


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may run a task as another user")
def test_a_task_runs_as_its_owner_with_their_groups_and_opens_its_output_files_as_them(sdir: StepDir) -> None:
    nobody = pwd.getpwnam("nobody")
    theirs = Path(tempfile.mkdtemp(prefix="corral-stepd-"))
    try:
        os.chown(theirs, nobody.pw_uid, nobody.pw_gid)
        as_them = RunAs(uid=nobody.pw_uid, gid=nobody.pw_gid, groups=[nobody.pw_gid, 100])
        spooled = TaskSpec(
            task=0,
            argv=["bash", "-c", "id -u; id -g; id -G"],
            cwd="/",
            env=ENV,
            # the step directory is the supervisor's (0700): it opens the spool file for the task
            stdout=OutputTarget(path=str(sdir.spool("out", 0)), private=True),
        )
        to_file = TaskSpec(
            task=1,
            argv=["id", "-un"],
            cwd="/",
            env=ENV,
            stdout=OutputTarget(path=str(theirs / "sub" / "1.out")),
        )
        # an -o file where the owner may not write: refused to them, though the supervisor could
        forbidden = TaskSpec(
            task=2, argv=["true"], cwd="/", env=ENV, stdout=OutputTarget(path=str(sdir.path / "2.out"))
        )
        assert run(sdir, [spooled, to_file, forbidden], run_as=as_them)[0] == "ok"
        assert sdir.spool("out", 0).read_text().split("\n")[:3] == [
            str(nobody.pw_uid),
            str(nobody.pw_gid),
            f"{nobody.pw_gid} 100",
        ]
        assert (theirs / "sub" / "1.out").read_text() == "nobody\n"
        for made in (theirs / "sub", theirs / "sub" / "1.out"):
            assert made.stat().st_uid == nobody.pw_uid  # created by the task, as its owner
        exit = sdir.exit_of(2, "n1")
        assert exit is not None and exit.exit_code == 2
        assert exit.error == f"open({sdir.path / '2.out'}): Permission denied"
        assert not (sdir.path / "2.out").exists()
    finally:
        shutil.rmtree(theirs)


def test_a_one_task_step_writes_its_pids_once(sdir: StepDir) -> None:
    """The pids are recorded when the task forks; the check after the tasks started finds them unchanged and
    writes nothing (a rewrite is a file created and renamed for every job)."""
    spec = StepSpec(user="u", key="k", job_id=1, attempt=0, step_id=0, tasks=[task(sdir, 0, "true")])
    sdir.write_spec(spec)
    # The supervisor as the agent starts it, its renames counted.
    counting = (
        "import atexit, os, runpy, sys\n"
        "renames = []\n"
        "replace = os.replace\n"
        "os.replace = lambda src, dst: (renames.append(os.path.basename(dst)), replace(src, dst))[1]\n"
        "atexit.register(lambda: print('renamed', *renames, file=sys.stderr))\n"
        f"sys.argv = [{stepd.__file__!r}, {str(sdir.path)!r}]\n"
        f"runpy.run_path({stepd.__file__!r}, run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", counting], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ok", "exit 0"]
    renamed = proc.stderr.split("renamed", 1)[1].split()
    assert renamed.count(stepd.PIDS_FILE) == 1, renamed
    pids = sdir.pids()
    assert pids is not None and set(pids.tasks) == {"0"}
