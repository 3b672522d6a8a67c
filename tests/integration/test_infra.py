"""The embedded launcher runs real nats-server and PostgreSQL processes that keep data across restarts."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import nats
import nats.aio.client
import nats.errors
import pytest

from corral.libs.infra import NatsServer, NatsUser, PostgresServer, ServerStartError
from corral.libs.infra.ports import free_port, port_is_free

pytestmark = pytest.mark.integration

ADMIN = NatsUser("admin", "admin-secret", publish=[">"], subscribe=[">"])
# A role like an agent's: it may publish its own events and read only its own inbox.
AGENT = NatsUser("agent", 'pa"ss\\word $x', publish=["events.node.>"], subscribe=["_INBOX.>"])


@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator[NatsServer]:
    with NatsServer(tmp_path / "nats", [ADMIN, AGENT]) as server:
        yield server


@pytest.fixture
def own_pg(tmp_path: Path) -> Iterator[PostgresServer]:
    with PostgresServer(tmp_path / "postgres") as server:
        yield server


def assert_process_group_gone(pid: int) -> None:
    """Neither the server nor any child it started is left."""
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


async def test_nats_jetstream_data_and_port_survive_a_restart(own_nats: NatsServer) -> None:
    nc = await nats.connect(own_nats.url, user=ADMIN.user, password=ADMIN.password)
    js = nc.jetstream()
    await js.add_stream(name="EVENTS", subjects=["events.>"])
    await js.publish("events.job.1", b"submitted")
    await nc.close()
    port, pid = own_nats.port, own_nats.pid
    assert pid is not None

    own_nats.stop()
    assert_process_group_gone(pid)
    own_nats.start()

    assert own_nats.port == port
    nc = await nats.connect(own_nats.url, user=ADMIN.user, password=ADMIN.password)
    try:
        message = await nc.jetstream().get_last_msg("EVENTS", "events.job.1")
    finally:
        await nc.close()
    assert message.data == b"submitted"


async def test_nats_limited_user_is_refused_a_forbidden_subject(own_nats: NatsServer) -> None:
    errors: asyncio.Queue[Exception] = asyncio.Queue()

    async def on_error(error: Exception) -> None:
        await errors.put(error)

    admin = await nats.connect(own_nats.url, user=ADMIN.user, password=ADMIN.password)
    agent = await nats.connect(own_nats.url, user=AGENT.user, password=AGENT.password, error_cb=on_error)
    try:
        seen = await admin.subscribe(">")
        # nats-py's flush() writes its PING ahead of the buffered SUB, so it does not prove the subscription
        # is registered; a message that comes back does.
        await admin.publish("probe", b"")
        assert (await seen.next_msg(timeout=5)).subject == "probe"
        await agent.publish("events.node.gpu1", b"up")
        await agent.publish("jobs.cancel", b"nope")
        await agent.flush()

        error = await asyncio.wait_for(errors.get(), timeout=5)
        assert "permissions violation for publish" in str(error).lower()
        assert "jobs.cancel" in str(error)
        allowed = await seen.next_msg(timeout=5)
        assert allowed.subject == "events.node.gpu1"
        with pytest.raises(nats.errors.TimeoutError):
            await seen.next_msg(timeout=0.2)
    finally:
        await agent.close()
        await admin.close()


async def test_nats_user_without_publish_subjects_may_publish_nothing(tmp_path: Path) -> None:
    # nats-server reads an empty allow list as "no restriction"; the launcher must render a deny instead.
    observer = NatsUser("observer", "observer-secret", publish=[], subscribe=[">"])
    errors: asyncio.Queue[Exception] = asyncio.Queue()

    async def on_error(error: Exception) -> None:
        await errors.put(error)

    with NatsServer(tmp_path / "nats", [observer]) as server:
        nc = await nats.connect(server.url, user=observer.user, password=observer.password, error_cb=on_error)
        try:
            await nc.publish("anything", b"x")
            await nc.flush()
            error = await asyncio.wait_for(errors.get(), timeout=5)
        finally:
            await nc.close()
    assert "permissions violation for publish" in str(error).lower()


async def test_nats_wrong_password_cannot_connect(own_nats: NatsServer) -> None:
    # A Client of our own, so the failed connection can be closed (nats.connect() would leak it).
    client = nats.aio.client.Client()
    try:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await client.connect(
                own_nats.url, user=ADMIN.user, password="wrong", allow_reconnect=False, connect_timeout=2
            )
    finally:
        await client.close()


def test_nats_config_is_private_and_has_no_anonymous_user(own_nats: NatsServer) -> None:
    assert stat.S_IMODE(own_nats.config_path.stat().st_mode) == 0o600
    config = own_nats.config_path.read_text()
    assert "no_auth_user" not in config
    assert '"admin-secret"' in config


def test_nats_start_failure_quotes_the_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = NatsServer(tmp_path / "nats", [ADMIN], port=port)
        with pytest.raises(ServerStartError) as raised:
            server.start()
    assert "address already in use" in raised.value.log_tail
    assert server.pid is None


async def select_names(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return [row["name"] for row in await conn.fetch("SELECT name FROM nodes ORDER BY name")]
    finally:
        await conn.close()


async def test_postgres_rows_and_port_survive_a_restart(own_pg: PostgresServer) -> None:
    conn = await asyncpg.connect(own_pg.dsn)
    try:
        await conn.execute("CREATE TABLE nodes (name text PRIMARY KEY)")
        await conn.execute("INSERT INTO nodes VALUES ('gpu1')")
    finally:
        await conn.close()
    port, pid = own_pg.port, own_pg.pid
    assert pid is not None

    own_pg.stop()
    assert_process_group_gone(pid)
    assert not (own_pg.pgdata / "postmaster.pid").exists()
    own_pg.start()

    assert own_pg.port == port
    assert await select_names(own_pg.dsn) == ["gpu1"]


async def test_postgres_password_is_required(own_pg: PostgresServer) -> None:
    assert stat.S_IMODE((own_pg.data_dir / "password").stat().st_mode) == 0o600
    wrong = own_pg.dsn.replace(own_pg.password, "wrong")
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(wrong)


async def test_postgres_runs_unprivileged_below_a_private_directory(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root is switched to the system user")
    # pytest resets /tmp/pytest-of-root to 0700 whenever another session starts; the server must not care.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with PostgresServer(private / "postgres") as server:
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert pwd.getpwuid(server.pgdata.stat().st_uid).pw_name == server.system_user
        assert pwd.getpwuid(os.stat(f"/proc/{server.pid}").st_uid).pw_name == server.system_user
        conn = await asyncpg.connect(server.dsn)
        try:
            assert await conn.fetchval("SELECT current_database()") == "corral"
        finally:
            await conn.close()


@pytest.mark.parametrize("lock_pid", ["dead", "unrelated"], ids=["dead-pid", "pid-reused"])
async def test_postgres_recovers_after_being_killed(own_pg: PostgresServer, lock_pid: str) -> None:
    conn = await asyncpg.connect(own_pg.dsn)
    try:
        await conn.execute("CREATE TABLE nodes (name text PRIMARY KEY)")
        await conn.execute("INSERT INTO nodes VALUES ('gpu1')")
    finally:
        await conn.close()
    pid = own_pg.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    own_pg.stop()  # reaps the killed server
    lock = own_pg.pgdata / "postmaster.pid"
    assert lock.exists()

    with subprocess.Popen(["sleep", "30"]) as unrelated:
        try:
            if lock_pid == "unrelated":
                # After a container restart the stale pid often names some other live process.
                lines = lock.read_text().split("\n")
                lock.write_text("\n".join([str(unrelated.pid), *lines[1:]]))
            own_pg.start()
        finally:
            unrelated.kill()

    assert await select_names(own_pg.dsn) == ["gpu1"]


def test_free_port_is_free() -> None:
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        assert not port_is_free(port)
