"""Shared fixtures: real servers on free ports in temporary directories, and small builders."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.libs import roles
from corral.libs.bus import Bus, connect, declare
from corral.libs.credentials import Credentials
from corral.libs.infra import NatsServer, PostgresServer

ADMIN_PASSWORD = "test-admin-secret"


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
