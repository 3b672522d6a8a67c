"""A whole local cluster of real processes (2 agents x 4 GPUs) and the real commands against it."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.libs.local_cluster import LocalCluster, ensure_resolvable

BIN = Path(sys.executable).parent


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


@pytest.fixture(scope="session")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A local cluster: NATS, PostgreSQL, every service, 2 agents with 4 GPUs each."""
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"), getpass.getuser(), nodes=2, gpus_per_node=4)
    config = cluster.prepare()
    warning = ensure_resolvable([n.name for n in config.nodes])
    assert warning is None, warning
    cluster.start(ready_timeout=90)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def cli(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """The commands, pointed at the local cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_"))}
    env["CORRAL_STATE_DIR"] = str(local_cluster.state_dir)
    return Cli(env=env, workdir=tmp_path_factory.mktemp("work"))


@pytest.fixture
def wait_for() -> Callable[[Callable[[], bool], float], None]:
    """Poll a condition until true or fail after a timeout."""

    def waiter(condition: Callable[[], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise AssertionError("condition not met in time")

    return waiter
