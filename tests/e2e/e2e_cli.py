"""Running Corral's Slurm commands against a cluster, as a user would."""

from __future__ import annotations

import dataclasses
import getpass
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.infra import roles

BIN = Path(sys.executable).parent


def user_env(state_dir: Path, *, commands_on_path: bool = False) -> dict[str, str]:
    """The environment of a user of the cluster at ``state_dir``: this process's, without a job's or a
    cluster's identity (``SLURM_*``, ``CORRAL_*``); with ``commands_on_path``, Corral's commands come first on
    ``PATH``, so that the jobs it submits find ``srun``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    env["CORRAL_STATE_DIR"] = str(state_dir)
    if commands_on_path:
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@dataclass
class Cli:
    """Runs Corral's Slurm commands as a user would, against one cluster."""

    env: dict[str, str]  # environment of the commands (CORRAL_STATE_DIR set)
    workdir: Path  # where jobs are submitted from

    def __call__(
        self, *argv: str, stdin: str | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one command; never raises on a non-zero exit."""
        return subprocess.run(
            [str(BIN / argv[0]), *argv[1:]],
            env=self.env,
            cwd=cwd or self.workdir,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def sbatch(self, script: str, *options: str) -> int:
        """Submit a script (on stdin) and return its job id."""
        out = self("sbatch", "--parsable", *options, stdin=script)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.strip())

    def sacct(self, job_id: int, fields: str = "State,ExitCode") -> str:
        """The job row of ``sacct -X -P -n``."""
        out = self("sacct", "-j", str(job_id), "-X", "-P", "-n", "-o", fields)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def wait_state(self, job_id: int, states: tuple[str, ...], timeout: float = 60.0) -> str:
        """Wait until sacct shows the job in one of ``states``; returns the row."""
        deadline = time.monotonic() + timeout
        row = ""
        while time.monotonic() < deadline:
            row = self.sacct(job_id)
            if row.split("|")[0].split(" ")[0] in states:
                return row
            time.sleep(0.3)
        raise AssertionError(f"job {job_id} did not reach {states} in {timeout}s (last: {row!r})")


def as_local(config: str) -> str:
    """A configuration as ``corral up`` writes it when started by this process: run by root (as in CI), every
    job of the tests is root's, so root's jobs are allowed (``[cluster] allow_root_jobs``)."""
    if os.geteuid() != 0 or "allow_root_jobs" in config:
        return config
    if "[cluster]\n" in config:
        return config.replace("[cluster]\n", "[cluster]\nallow_root_jobs = true\n", 1)
    return "[cluster]\nallow_root_jobs = true\n" + config


def admin_cli(cli: Cli, cluster: LocalCluster) -> Cli:
    """The commands run as the cluster's admin role (the gateway's ``--admin``)."""
    return cli_as(cli, cluster, cluster.role_credentials(roles.ADMIN))


def cli_as(cli: Cli, cluster: LocalCluster, credentials: Path) -> Cli:
    """The commands run as the identity of a credentials file (a role's, or a guest's of ``cluster``)."""
    assert cluster.nats is not None
    env = dict(cli.env)
    env["CORRAL_NATS_URL"] = cluster.nats.url
    env["CORRAL_CREDENTIALS"] = str(credentials)
    return dataclasses.replace(cli, env=env)


@contextmanager
def guest_cluster(root: Path, nodes: int, guests: tuple[str, ...]) -> Iterator[LocalCluster]:
    """A local cluster of our own (2 GPUs a node) whose ``guests`` have credentials files beside its user's
    (``cli_as`` acts as one), started."""
    cluster = LocalCluster(root / "state", getpass.getuser(), nodes=nodes, gpus_per_node=2, guests=guests)
    cluster.prepare()
    cluster.start(ready_timeout=90)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def own_cluster(root: Path, config: str, nodes: int, gpus_per_node: int) -> Iterator[Cli]:
    """A local cluster of our own with configuration ``config``, started; a Cli that submits from ``root``."""
    cluster = LocalCluster(root / "state", getpass.getuser(), nodes=nodes, gpus_per_node=gpus_per_node)
    cluster.state_dir.mkdir(mode=0o700)
    cluster.config_path.write_text(as_local(config))
    parsed = cluster.prepare()
    assert ensure_resolvable([n.name for n in parsed.nodes]) is None
    cluster.start(ready_timeout=90)
    try:
        yield Cli(env=user_env(cluster.state_dir), workdir=root)
    finally:
        cluster.stop()


def wait_for_line(path: Path, prefix: str, timeout: float = 30.0) -> str:
    """The first line of ``path`` that starts with ``prefix``, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(prefix):
                    return line
        time.sleep(0.2)
    text = path.read_text() if path.exists() else "(no such file)"
    raise AssertionError(f"no {prefix!r} line in {path} after {timeout}s; it holds: {text!r}")


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


#: The working directory of a step's supervisor: its run's or step's directory in its agent's state
#: (``<state>/agents/<node>/jobs/<job>.<attempt>`` or ``.../stepd/<job>.<attempt>.<step>``).
SUPERVISOR_CWD = re.compile(r"/agents/([^/]+)/(?:jobs|stepd)/(\d+)\.(\d+)(?:\.\d+)?")


def job_processes(job: int) -> list[tuple[int, str, str]]:
    """(pid, node, attempt) of every live process of the job: its tasks and scripts, by the job's variables
    in /proc/<pid>/environ, and its supervisors, by their working directory (one forked by its node's fork
    server has the server's environment)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if state == "Z":
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        if env.get("SLURM_JOB_ID") == str(job):
            found.append((int(pid), env.get("SLURMD_NODENAME", "?"), env.get("SLURM_RESTART_COUNT", "?")))
        elif (supervisor := SUPERVISOR_CWD.search(cwd)) and (supervisor.end(), supervisor[2]) == (
            len(cwd),
            str(job),
        ):
            found.append((int(pid), supervisor[1], supervisor[3]))
    return found
