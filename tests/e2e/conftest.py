"""A whole local cluster of real processes (2 agents x 4 GPUs) and the real commands against it."""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_cli import BIN, Cli, user_env

from corral.cli.local_cluster import LocalCluster, ensure_resolvable


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


#: The most lines of each service's log a failed test's report shows.
LOG_LINES = 40


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """A failed test on the shared cluster shows what its services logged above info (the cluster is gone when
    CI prints the failure): a job that never reached the accounting, say, shows the projection's complaint."""
    report: pytest.TestReport = yield
    cluster = getattr(item, "funcargs", {}).get("local_cluster")
    if report.when == "call" and report.failed and isinstance(cluster, LocalCluster):
        report.sections.append(("cluster logs above info", cluster_warnings(cluster.state_dir / "logs")))
    return report


def cluster_warnings(logs: Path) -> str:
    """The last ``LOG_LINES`` lines of each service's log that are not at level info or debug."""
    quiet = ('"level": "info"', '"level": "debug"')
    parts = []
    for log in sorted(logs.glob("*.log")):
        lines = [
            line
            for line in log.read_text(errors="replace").splitlines()
            if not line.endswith("}") or not any(level in line for level in quiet)
        ]
        if lines:
            parts.append(f"== {log.name}\n" + "\n".join(lines[-LOG_LINES:]))
    return "\n".join(parts) or "(nothing above info)"


@pytest.fixture(scope="session")
def cli(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """The commands, pointed at the local cluster."""
    return Cli(env=user_env(local_cluster.state_dir), workdir=tmp_path_factory.mktemp("work"))


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


@pytest.fixture
def slurm_env(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test process as a user's shell on the cluster: Corral's commands first on PATH, in tmp_path."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "CORRAL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CORRAL_STATE_DIR", cli.env["CORRAL_STATE_DIR"])
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.chdir(tmp_path)
    return tmp_path
