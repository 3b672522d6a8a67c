"""A local cluster whose start fails leaves nothing running.

A service that exits at start (the CI run of 2026-12-07 saw a scheduler exit with status 2) or a cluster not
ready in time raised from ``LocalCluster.start`` with the NATS and PostgreSQL servers, the other services and
the agents still running: a test's fixture that had not reached its ``try`` leaked them into the tests after
it (ResourceWarnings for live subprocesses failed an unrelated test). ``start`` now stops what it started
before raising.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

import pytest

from corral.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.e2e


def test_a_start_that_fails_stops_its_servers_services_and_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = LocalCluster(tmp_path / "state", getpass.getuser(), nodes=1, gpus_per_node=1)
    started: dict[str, Any] = {}

    def not_ready(self: LocalCluster, timeout: float) -> None:
        started["processes"] = [p.proc for p in self.processes if p.proc is not None]
        started["servers"] = [self.nats, self.postgres]
        raise TimeoutError("the local cluster did not become ready (as the test has it)")

    monkeypatch.setattr(LocalCluster, "wait_ready", not_ready)
    try:
        with pytest.raises(TimeoutError, match="as the test has it"):
            cluster.start()
        assert len(started["processes"]) >= 8  # the services, the agent and authd
        running = [proc.args for proc in started["processes"] if proc.poll() is None]
        assert running == []
        assert [server.pid for server in started["servers"]] == [None, None]
    finally:
        cluster.stop()  # (idempotent; what the code before left running)


def test_a_service_that_cannot_bind_its_metrics_port_fails_the_start_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What two services given the same port see: the second to bind exits with status 2. The state directory
    # of a test is gone by the time its failure is read, so the error carries the end of the service's log.
    import socket

    from corral.cli import local_cluster
    from corral.libs.infra.ports import free_port

    cluster = LocalCluster(tmp_path / "state", getpass.getuser(), nodes=1, gpus_per_node=1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", free_port()))
        held.listen()
        taken = held.getsockname()[1]
        calls = iter(range(1000))
        # The first service spawned (auth) gets the port held here; the others get free ones.
        monkeypatch.setattr(local_cluster, "free_port", lambda: taken if next(calls) == 0 else free_port())
        try:
            with pytest.raises(RuntimeError, match="exited with status 2") as failed:
                cluster.start(ready_timeout=60)
        finally:
            cluster.stop()
    assert f"cannot serve metrics on 127.0.0.1:{taken}" in str(failed.value)
