"""A whole local cluster of real processes (2 agents x 4 GPUs) and the real commands against it."""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable, Iterator

import pytest
from e2e_cli import Cli

from corral.libs.local_cluster import LocalCluster, ensure_resolvable


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
