"""The command server (``corral.cli.cmdserver``): served commands behave as commands run by themselves.

Every e2e test's commands go through a server already (the run's ``XDG_RUNTIME_DIR``, ``tests/conftest.py``);
these tests pin what could differ: output and status, the caller's environment, directory, stdin and time
zone, signals, and when a command is not served (a stale server, inside a job, an unsafe directory).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cmdserver_proc import children, holders
from e2e_cli import BIN, Cli

from corral.cli import cmdclient, cmdserver


def _env(cli: Cli, **extra: str) -> dict[str, str]:
    return {**cli.env, **extra}


def _servers(env: dict[str, str]) -> list[int]:
    """The servers running in the runtime directory of ``env``."""
    return cmdclient.live_servers(cmdclient.runtime_dir(env))


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[str]:
    """A runtime directory of the test's own (one server in it at most), its servers stopped after."""
    directory = tmp_path / "runtime"
    directory.mkdir(mode=0o700)
    yield str(directory)
    cmdclient.stop_servers(cmdclient.runtime_dir({"XDG_RUNTIME_DIR": str(directory)}))


def _served_cli(cli: Cli, **extra: str) -> Cli:
    """``cli`` requiring its commands to be served; its server started and answering."""
    warm = Cli(env=_env(cli, **extra), workdir=cli.workdir)
    warm("squeue")  # starts the server if there is none
    required = Cli(env=_env(cli, CORRAL_CMD_SERVER="require", **extra), workdir=cli.workdir)
    deadline = time.monotonic() + 30
    while required("squeue").returncode != 0:
        assert time.monotonic() < deadline, "no command server came up"
        time.sleep(0.2)
    return required


def test_served_commands_print_and_exit_as_direct_ones(cli: Cli) -> None:
    served = _served_cli(cli)
    direct = Cli(env=_env(cli, CORRAL_CMD_SERVER="off"), workdir=cli.workdir)
    job = cli.sbatch("#!/bin/sh\ntrue\n", "-J", "served-compare")
    cli.wait_state(job, ("COMPLETED",))
    for argv in (
        ("squeue", "-a"),
        ("sinfo",),
        ("sacct", "-j", str(job), "-X", "-P", "-o", "JobID,JobName,State,ExitCode"),
        ("scontrol", "show", "job", str(job)),
        ("sbatch", "--bogus"),
        ("sbatch", "--gres=gpu:x", "--wrap", "true"),
        ("scancel", "--signal=NOSUCH", str(job)),
        ("sacct", "--version"),
    ):
        one, other = served(*argv), direct(*argv)
        assert (one.returncode, one.stdout, one.stderr) == (other.returncode, other.stdout, other.stderr), (
            argv
        )
    assert served("sbatch", "--bogus").returncode == 255  # Slurm's getopt exit status


def test_a_served_sbatch_takes_the_callers_environment_directory_and_stdin(cli: Cli, tmp_path: Path) -> None:
    served = _served_cli(cli)
    token = uuid.uuid4().hex
    workdir = tmp_path / "submit here"
    workdir.mkdir()
    out = subprocess.run(
        [str(BIN / "sbatch"), "--parsable"],
        input='#!/bin/sh\necho "$CORRAL_TEST_TOKEN $PWD"\n',
        env={**served.env, "CORRAL_TEST_TOKEN": token},
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    job = int(out.stdout.strip())
    cli.wait_state(job, ("COMPLETED",))
    assert (workdir / f"slurm-{job}.out").read_text() == f"{token} {workdir}\n"


def test_a_served_command_shows_times_in_the_callers_time_zone(cli: Cli) -> None:
    served = _served_cli(cli)
    job = cli.sbatch("#!/bin/sh\ntrue\n")
    cli.wait_state(job, ("COMPLETED",))
    argv = ("sacct", "-j", str(job), "-X", "-n", "-P", "-o", "Submit")
    shown = {}
    for zone in ("UTC", "Asia/Kathmandu"):  # +05:45: no other zone shares its clock
        one = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]], env={**served.env, "TZ": zone}, capture_output=True, text=True
        )
        other = subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            env={**served.env, "TZ": zone, "CORRAL_CMD_SERVER": "off"},
            capture_output=True,
            text=True,
        )
        assert one.returncode == 0, one.stderr
        assert one.stdout == other.stdout
        shown[zone] = one.stdout
    assert shown["UTC"] != shown["Asia/Kathmandu"]


@pytest.mark.parametrize(("sent", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_signals_reach_the_served_command(cli: Cli, runtime: str, sent: signal.Signals, status: int) -> None:
    served = _served_cli(cli, XDG_RUNTIME_DIR=runtime)
    (server,) = _servers(served.env)
    before = served("squeue", "-h", "-a", "-o", "%i").stdout
    # sbatch with no script reads it from stdin, which stays open: it waits until the signal
    proc = subprocess.Popen(
        [str(BIN / "sbatch")],
        env=served.env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 15
        assert proc.stdin is not None
        # the server's child that holds our pipe (a spare waits beside it)
        while not (child := holders(proc.stdin.fileno(), children(server))):
            assert time.monotonic() < deadline, "the command was not handed to the server"
            time.sleep(0.02)
        proc.send_signal(sent)
        assert proc.wait(timeout=15) == status
        # the child that ran sbatch got the signal too: it does not wait on for its (still open) stdin
        deadline = time.monotonic() + 15
        while Path(f"/proc/{child[0]}").exists():
            assert time.monotonic() < deadline, "the signal did not reach the served command"
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.communicate()
    assert served("squeue", "-h", "-a", "-o", "%i").stdout == before  # nothing was submitted


def test_a_stale_server_is_replaced(cli: Cli, runtime: str) -> None:
    served = _served_cli(cli, XDG_RUNTIME_DIR=runtime)
    (old,) = _servers(served.env)
    watched = Path(cmdserver.__file__).with_name("sshare.py")  # a module every server has loaded
    stat = watched.stat()
    try:
        os.utime(watched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
        # refused by the stale server, so run by itself; the server exits
        default = Cli(env=_env(cli, XDG_RUNTIME_DIR=runtime), workdir=cli.workdir)
        assert default("squeue").returncode == 0
        deadline = time.monotonic() + 15
        while Path(f"/proc/{old}").exists():
            assert time.monotonic() < deadline, "the stale server did not exit"
            time.sleep(0.1)
        fresh = _served_cli(cli, XDG_RUNTIME_DIR=runtime)  # a new one, with the changed file
        (new,) = _servers(fresh.env)
        assert new != old
    finally:
        os.utime(watched, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    # and once more: the restored file makes that server stale as well, which is replaced the same way
    assert Cli(env=_env(cli, XDG_RUNTIME_DIR=runtime), workdir=cli.workdir)("squeue").returncode == 0


def test_commands_inside_a_job_are_not_served(cli: Cli) -> None:
    inside = Cli(env=_env(cli, CORRAL_CMD_SERVER="require", SLURM_JOB_ID="1"), workdir=cli.workdir)
    out = inside("squeue")
    assert out.returncode == 0, out.stderr  # run by itself: "require" does not apply inside a job


def test_a_directory_others_can_enter_is_not_used(cli: Cli, tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    (runtime / "corral").mkdir(parents=True)
    (runtime / "corral").chmod(0o755)
    env = _env(cli, XDG_RUNTIME_DIR=str(runtime))
    assert Cli(env=env, workdir=cli.workdir)("squeue").returncode == 0  # runs by itself
    required = Cli(env={**env, "CORRAL_CMD_SERVER": "require"}, workdir=cli.workdir)("squeue")
    assert required.returncode == 1
    assert f"{runtime / 'corral'} is not a directory of user {os.getuid()} with mode 0700" in required.stderr
    assert not list((runtime / "corral").iterdir())  # no server was started there


def test_an_idle_server_exits_and_removes_its_socket(cli: Cli, runtime: str) -> None:
    env = _env(cli, XDG_RUNTIME_DIR=runtime, CORRAL_CMD_SERVER_IDLE="2")
    _served_cli(Cli(env=env, workdir=cli.workdir))
    (pid,) = _servers(env)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "the idle server did not exit"
        time.sleep(0.2)
    assert list(Path(cmdclient.runtime_dir(env)).glob("*.sock")) == []
    assert _servers(env) == []  # its lock file stays, unlocked: the pid in it is no server's now


def test_many_commands_served_at_once(cli: Cli) -> None:
    served = _served_cli(cli)
    procs = [
        subprocess.Popen(
            [str(BIN / "squeue")], env=served.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(16)
    ]
    results = [(proc.wait(timeout=60), proc.communicate()) for proc in procs]
    assert all(status == 0 and out.startswith(b"             JOBID") for status, (out, _) in results), results


def test_a_command_with_stdin_closed_is_not_served(cli: Cli) -> None:
    _served_cli(cli)

    def close_stdin() -> None:
        os.close(0)

    required = subprocess.run(
        [str(BIN / "squeue")],
        env={**cli.env, "CORRAL_CMD_SERVER": "require"},
        capture_output=True,
        preexec_fn=close_stdin,
    )
    assert required.returncode == 1
    assert b"not served by a command server: a standard stream is closed" in required.stderr
    by_itself = subprocess.run(
        [str(BIN / "squeue")], env=cli.env, capture_output=True, preexec_fn=close_stdin
    )
    assert by_itself.returncode == 0, by_itself.stderr
