"""Real Unix users for the tests where identity matters: created with ``useradd``, removed after, and the
Corral commands made runnable by them.

The test's interpreter may live where another user cannot go (a pyenv under ``/root``), so a user's commands
are copies of the installed ones whose ``#!`` names an interpreter of the same version that they can run,
with the same packages on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_cli import Cli

import corral
from corral.cli.local_cluster import LocalCluster

#: Where the commands are installed.
BIN = Path(sys.executable).parent
#: The commands a user of the tests runs (and their jobs: srun).
COMMANDS = ("sbatch", "srun", "scancel", "squeue", "sacct", "scontrol", "sinfo")


@dataclass(frozen=True)
class UnixUser:
    """A user made for a test."""

    name: str  # login name
    uid: int  # user id
    gid: int  # primary group
    home: Path  # home directory (theirs, 0755)


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _remove(names: tuple[str, ...], group: str) -> None:
    for name in names:
        subprocess.run(["userdel", "-r", "-f", name], capture_output=True, check=False)
    subprocess.run(["groupdel", group], capture_output=True, check=False)


@contextmanager
def unix_users(names: tuple[str, ...], group: str) -> Iterator[list[UnixUser]]:
    """Users ``names`` (home directories included) and a group ``group`` the first of them is in as a
    supplementary group; all removed afterwards (also what an interrupted earlier run left). Skips the test
    unless it runs as root."""
    if os.geteuid() != 0:
        pytest.skip("creating Unix users (useradd) needs root")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is needed to create the users")
    _remove(names, group)
    try:
        _run("groupadd", group)
        for name in names:
            _run("useradd", "-m", "-s", "/bin/bash", name)
        _run("usermod", "-aG", group, names[0])
        users = []
        for name in names:
            entry = pwd.getpwnam(name)
            home = Path(entry.pw_dir)
            home.chmod(0o755)  # a file's own mode is what keeps it private in these tests
            users.append(UnixUser(name, entry.pw_uid, entry.pw_gid, home))
        yield users
    finally:
        _remove(names, group)


@contextmanager
def open_directory(prefix: str) -> Iterator[Path]:
    """A new directory other users may traverse (0711, under ``/tmp``), removed afterwards: a cluster's
    state there lets jobs that run as their owners reach their scripts (pytest's own temporary directories
    are closed to everyone but their owner)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        folder.chmod(0o711)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def python_path() -> str:
    """``PYTHONPATH`` that gives another interpreter of this version the packages this one has: Corral's
    source and the installed packages."""
    paths = [str(Path(corral.__file__).resolve().parents[1]), sysconfig.get_paths()["purelib"]]
    return os.pathsep.join(dict.fromkeys(paths))


def _candidates() -> list[str]:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    found = [
        sys.executable,
        os.path.realpath(sys.executable),
        f"/usr/bin/{version}",
        f"/usr/local/bin/{version}",
    ]
    return [c for c in dict.fromkeys(found) if os.path.exists(c)]


def _runs(user: UnixUser, argv: list[str], env: dict[str, str]) -> bool:
    """Whether ``argv`` runs and succeeds as ``user``."""
    try:
        return as_user(user, argv, env, user.home).returncode == 0
    except OSError:
        return False  # they may not execute it


@contextmanager
def user_commands(user: UnixUser) -> Iterator[Path]:
    """A directory (0755) of the Corral commands runnable by ``user`` (and so by anyone): each installed
    command with an interpreter they can execute; removed afterwards. Skips when there is none."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": python_path(), "HOME": str(user.home)}
    probe = ["-c", "import msgspec, nats, corral.cli.sbatch"]
    python = next((c for c in _candidates() if _runs(user, [c, *probe], env)), None)
    if python is None:
        pytest.skip(f"no Python {sys.version_info.major}.{sys.version_info.minor} that {user.name} may run")
    folder = Path(tempfile.mkdtemp(prefix="corral-user-bin-"))
    try:
        folder.chmod(0o755)
        for name in COMMANDS:
            lines = (BIN / name).read_text().splitlines(keepends=True)
            (folder / name).write_text(f"#!{python}\n" + "".join(lines[1:]))
            (folder / name).chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_user(
    user: UnixUser, argv: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` (their uid, gid and groups: the kernel's view of who they are)."""
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        user=user.uid,
        group=user.gid,
        extra_groups=os.getgrouplist(user.name, user.gid),
    )


@dataclass
class UserCli(Cli):
    """The commands run by a real Unix user (their uid, gid and groups), with their own copy of their
    credentials (the guests' files are root's)."""

    user: UnixUser | None = None  # who runs them

    def __call__(
        self, *argv: str, stdin: str | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        assert self.user is not None
        return as_user(self.user, list(argv), self.env, cwd or self.workdir, stdin)


def user_cli(cluster: LocalCluster, user: UnixUser, commands: Path) -> UserCli:
    """``user``'s commands (those in ``commands``, from ``user_commands``) against ``cluster``, of which
    they are a guest, run as them from their home directory with their own copy of their credentials."""
    creds = user.home / ".corral-credentials.json"
    shutil.copyfile(cluster.credentials_of(user.name), creds)
    os.chown(creds, user.uid, user.gid)
    creds.chmod(0o600)
    assert cluster.nats is not None
    env = {
        "PATH": f"{commands}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user.home),
        "USER": user.name,
        "LOGNAME": user.name,
        "PYTHONPATH": python_path(),
        "CORRAL_STATE_DIR": str(cluster.state_dir),
        "CORRAL_CREDENTIALS": str(creds),
        "CORRAL_NATS_URL": cluster.nats.url,
        "CORRAL_CMD_SERVER": "off",
    }
    return UserCli(env=env, workdir=user.home, user=user)
