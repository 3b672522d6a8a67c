"""Supervisors as the agent starts them (supervisor.py): forked by the node's fork server (stepd_fork.py) or
started as new interpreters, real processes with real tasks either way, read back through the step
directory; and the fork server's own life: it reaps its supervisors, outlives its agent until the last one
ended, is started again when it died, and a launch it cannot answer gets a new interpreter."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from paused import pause
from test_stepd import task

from corral.services.agent import killseq, procstat, supervisor
from corral.services.agent.stepdir import StepDir, StepSpec
from corral.services.agent.supervisor import Supervisor, Supervisors

pytestmark = pytest.mark.unit

WAYS = ["forked", "interpreter"]


def ppid(pid: int) -> int:
    """The parent of a live process (from /proc)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` is gone (not even a zombie) within ``timeout`` seconds (the loop runs meanwhile: this
    process reaps its own children from it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.fixture
async def supervisors(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Supervisors]:
    way = getattr(request, "param", "forked")
    starter = Supervisors(tmp_path / "agent", fork=way == "forked")
    yield starter
    server = starter.server_pid
    starter.close()
    if server is not None:
        assert await gone(server)  # no supervisor left: it ends with its socket


def step(tmp_path: Path, number: int = 0) -> StepDir:
    sdir = StepDir(tmp_path / "stepd", (1, 0, number))
    sdir.create()
    return sdir


async def start(
    supervisors: Supervisors, sdir: StepDir, scripts: list[str], stdin: int | None = None
) -> tuple[Supervisor, str]:
    """The supervisor of a step of bash ``scripts`` (task 0 reading ``stdin`` if given) and its handshake
    (its stdout is closed after it: it says the tasks' ends to nobody, which it ignores)."""
    tasks = [task(sdir, n, script, stdin=stdin is not None and n == 0) for n, script in enumerate(scripts)]
    sdir.write_spec(StepSpec(user="u", key="k", job_id=1, attempt=0, step_id=sdir.key[2], tasks=tasks))
    log = os.open(sdir.file("stepd.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        proc = await supervisors.start(sdir.path, log, stdin, {"PATH": os.defpath})
    finally:
        os.close(log)
        if stdin is not None:
            os.close(stdin)
    try:
        line = await asyncio.wait_for((await proc.reader()).readline(), 30)
    finally:
        proc.close_stdout()  # as the batch step's launch does (a step's agent reads on: step_output.listen)
    return proc, line.decode().strip()


@pytest.mark.parametrize("supervisors", WAYS, indirect=True)
async def test_either_way_the_supervisor_runs_its_tasks_in_its_own_session_and_records_them(
    tmp_path: Path, supervisors: Supervisors
) -> None:
    sdir = step(tmp_path)
    read, write = os.pipe()
    proc, line = await start(supervisors, sdir, ["read line; echo got $line; exit 3", "exit 0"], stdin=read)
    assert line == "ok"
    assert proc.alive()
    # what the agent and a restarted agent read of it: its pid, with its start ticks, in the pids file
    pids = sdir.pids()
    assert pids is not None and pids.stepd == (proc.pid, procstat.start_ticks(proc.pid))
    assert os.getsid(proc.pid) == proc.pid  # detached: its own session
    assert Path(f"/proc/{proc.pid}/cwd").resolve() == sdir.path.resolve()
    os.write(write, b"hello\n")
    os.close(write)
    assert await proc.wait(30)
    assert not proc.alive()
    exits = {t: sdir.exit_of(t, "n1") for t in (0, 1)}
    assert [(e.exit_code if e else None) for e in exits.values()] == [3, 0]
    assert sdir.spool("out", 0).read_text() == "got hello\n"
    assert await gone(proc.pid)  # reaped by its parent: no zombie left


@pytest.mark.parametrize("supervisors", WAYS, indirect=True)
async def test_either_way_the_kill_sequence_reaches_the_tasks(
    tmp_path: Path, supervisors: Supervisors
) -> None:
    sdir = step(tmp_path)
    proc, line = await start(
        supervisors, sdir, ["trap 'echo term; exit 7' TERM; touch trapped; sleep 300 & wait"]
    )
    assert line == "ok"
    deadline = time.monotonic() + 10
    while not (sdir.path / "trapped").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert killseq.request(str(sdir.path), 5.0, proc.pid)
    assert await proc.wait(30)
    exit = sdir.exit_of(0, "n1")
    assert exit is not None and exit.exit_code == 7
    assert sdir.spool("out", 0).read_text() == "term\n"


def until(go: Path) -> str:
    """A task that runs until ``go`` exists."""
    return f"while [ ! -e {go} ]; do sleep 0.02; done"


async def test_a_forked_supervisor_is_the_fork_servers_child_and_outlives_the_agents_end(
    tmp_path: Path, supervisors: Supervisors
) -> None:
    first, line = await start(supervisors, step(tmp_path, 0), [until(tmp_path / "go1")])
    second, _ = await start(supervisors, step(tmp_path, 1), [until(tmp_path / "go2")])
    assert line == "ok"
    server = ppid(first.pid)
    assert server == supervisors.server_pid != os.getpid() and ppid(second.pid) == server  # one forked both
    assert os.getsid(server) == server  # detached like a supervisor
    (tmp_path / "go2").touch()
    assert await second.wait(30) and await gone(second.pid)  # reaped by the server while it still serves
    supervisors.close()  # the agent stops: its supervisors go on, the server waits for them
    assert supervisors.server_pid is None
    assert first.alive() and not await gone(server, 0.1)
    (tmp_path / "go1").touch()
    assert await first.wait(30)
    exit = StepDir(tmp_path / "stepd", (1, 0, 0)).exit_of(0, "n1")
    assert exit is not None and exit.exit_code == 0
    assert await gone(first.pid) and await gone(server)  # it reaped the last one, then ended


async def test_a_dead_fork_server_is_started_again_and_its_supervisors_go_on(
    tmp_path: Path, supervisors: Supervisors
) -> None:
    first, _ = await start(supervisors, step(tmp_path, 0), [until(tmp_path / "go")])
    old = ppid(first.pid)
    os.kill(old, signal.SIGKILL)
    assert await gone(old)  # (reaped here: this process started it)
    second, line = await start(supervisors, step(tmp_path, 1), [until(tmp_path / "go")])
    assert line == "ok"
    assert ppid(second.pid) not in (old, os.getpid())  # a new server's child
    (tmp_path / "go").touch()
    assert await first.wait(30) and await second.wait(30)  # the orphan ran to its end too
    exit = StepDir(tmp_path / "stepd", (1, 0, 0)).exit_of(0, "n1")
    assert exit is not None and exit.exit_code == 0


async def test_a_launch_the_server_cannot_answer_gets_a_new_interpreter(
    tmp_path: Path, supervisors: Supervisors, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = await start(supervisors, step(tmp_path, 0), ["exit 0"])
    server = supervisors.server_pid
    assert server is not None
    await first.wait(30)
    monkeypatch.setattr(supervisor, "FORK_ANSWER_S", 0.5)
    pause(server)  # stuck
    try:
        proc, line = await start(supervisors, step(tmp_path, 1), [until(tmp_path / "go") + "; exit 4"])
        assert line == "ok"
        assert supervisors.server_pid is None  # dropped
        assert ppid(proc.pid) == os.getpid()  # started here, as a new interpreter
        (tmp_path / "go").touch()
        assert await proc.wait(30) and await gone(proc.pid)  # and reaped here
        exit = StepDir(tmp_path / "stepd", (1, 0, 1)).exit_of(0, "n1")
        assert exit is not None and exit.exit_code == 4
    finally:
        os.kill(server, signal.SIGCONT)
    assert await gone(server)  # its socket closed, no supervisor left: it ended
    third, _ = await start(supervisors, step(tmp_path, 2), ["exit 0"])
    assert supervisors.server_pid not in (None, server)  # the next launch has a new server
    await third.wait(30)


async def test_a_launch_cancelled_while_the_server_answers_does_not_hand_its_answer_to_the_next(
    tmp_path: Path, supervisors: Supervisors
) -> None:
    first, _ = await start(supervisors, step(tmp_path, 0), ["exit 0"])
    server = supervisors.server_pid
    assert server is not None
    await first.wait(30)
    pause(server)  # the request goes out, its answer cannot come yet
    try:
        cancelled = asyncio.ensure_future(start(supervisors, step(tmp_path, 1), [until(tmp_path / "go")]))
        await asyncio.sleep(0.3)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
    finally:
        os.kill(server, signal.SIGCONT)
    sdir = step(tmp_path, 2)
    proc, line = await start(supervisors, sdir, [until(tmp_path / "go")])
    assert line == "ok"
    pids = sdir.pids()
    assert pids is not None and pids.stepd[0] == proc.pid  # its own supervisor, not the cancelled one's
    (tmp_path / "go").touch()
    assert await proc.wait(30)
    assert await gone(server)  # the cancelled launch's supervisor ran and ended, then its server


async def test_a_supervisor_killed_before_its_handshake_is_seen_ended(
    tmp_path: Path, supervisors: Supervisors
) -> None:
    sdir = step(tmp_path)
    sdir.write_spec(
        StepSpec(user="u", key="k", job_id=1, attempt=0, step_id=0, tasks=[task(sdir, 0, "exit 0")])
    )
    log = os.open(sdir.file("stepd.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    proc = await supervisors.start(sdir.path, log, None, {"PATH": os.defpath})
    os.close(log)
    proc.kill()
    assert await proc.wait(10) and not proc.alive()
    proc.close_stdout()
