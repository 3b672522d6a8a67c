"""Shared fixtures: real servers on free ports in temporary directories, and small builders."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import otlp_receiver
import pytest

from corral.cli import cmdclient
from corral.libs.infra import NatsServer, PostgresServer, roles
from corral.libs.runtime.bus import Bus
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare

ADMIN_PASSWORD = "test-admin-secret"
# The run's directory for command servers, and the XDG_RUNTIME_DIR it replaced.
_RUNTIME = pytest.StashKey[tuple[str, str | None]]()


def pytest_configure(config: pytest.Config) -> None:
    """The commands the tests run start their command servers in a directory of this run, stopped at its end
    (set before any fixture copies the environment for the commands)."""
    runtime = tempfile.mkdtemp(prefix="corral-tests-runtime-")
    config.stash[_RUNTIME] = (runtime, os.environ.get("XDG_RUNTIME_DIR"))
    os.environ["XDG_RUNTIME_DIR"] = runtime


def pytest_unconfigure(config: pytest.Config) -> None:
    runtime, before = config.stash[_RUNTIME]
    cmdclient.stop_servers(cmdclient.runtime_dir({"XDG_RUNTIME_DIR": runtime}))
    shutil.rmtree(runtime, ignore_errors=True)
    if before is None:
        os.environ.pop("XDG_RUNTIME_DIR", None)
    else:
        os.environ["XDG_RUNTIME_DIR"] = before


@pytest.fixture
def otlp() -> Iterator[otlp_receiver.OtlpReceiver]:
    """A real OTLP/HTTP receiver on a free port that decodes what it gets with opentelemetry-proto."""
    yield from otlp_receiver.serve()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """A real nats-server with JetStream, with the admin role and user ``alice``."""
    users = [
        roles.service_user(roles.ADMIN, ADMIN_PASSWORD),
        roles.user_user("alice", "alice-secret"),
    ]
    server = NatsServer(tmp_path_factory.mktemp("nats"), users)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def admin_creds(nats_server: NatsServer) -> Credentials:
    """Admin credentials for the test NATS server."""
    return Credentials(url=nats_server.url, user=roles.ADMIN, password=ADMIN_PASSWORD)


@pytest.fixture(scope="session")
async def bus(admin_creds: Credentials) -> AsyncIterator[Bus]:
    """A bus on the test server as admin, with Corral's streams declared."""
    nc = await connect(admin_creds, name="tests")
    await declare(nc.jetstream())
    yield Bus(nc, actor="tests")
    await nc.drain()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """A real PostgreSQL server."""
    server = PostgresServer(Path(tmp_path_factory.mktemp("pg")))
    server.start()
    yield server
    server.stop()
