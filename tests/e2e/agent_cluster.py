"""A local cluster of our own for the agent's tests: they stop and restart agents, and need short timings."""

from __future__ import annotations

import asyncio
import getpass
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nats.js.errors
from e2e_cli import Cli, as_local, user_env

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.config.cluster import local_config_text
from corral.libs.infra import roles
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import api, subjects
from corral.schemas.codec import decode


@contextmanager
def agent_cluster(
    root: Path, node_timeout: int = 30, kill_wait: int = 2
) -> Iterator[tuple[LocalCluster, Cli]]:
    """A 2-node cluster (2 GPUs each) with a long node timeout (agent restarts do not mark nodes down) and
    a short KillWait."""
    cluster = LocalCluster(root / "state", getpass.getuser(), nodes=2, gpus_per_node=2)
    cluster.state_dir.mkdir(mode=0o700)
    text = local_config_text("local", ["node1", "node2"], 2, 8, 64 * 1024)
    text = text.replace("node_timeout = 6", f'node_timeout = "0:{node_timeout}"')
    text = text.replace("kill_wait = 3", f'kill_wait = "0:{kill_wait:02d}"')
    cluster.config_path.write_text(as_local(text))
    config = cluster.prepare()
    assert config.node_timeout_s == node_timeout and config.kill_wait_s == kill_wait
    assert ensure_resolvable([n.name for n in config.nodes]) is None
    cluster.start(ready_timeout=90)
    env = user_env(cluster.state_dir)
    work = root / "work"
    work.mkdir()
    try:
        yield cluster, Cli(env=env, workdir=work)
    finally:
        cluster.stop()


def wait_until(condition: object, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``condition()`` until true."""
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met in {timeout}s")


def launch_orders(cluster: LocalCluster, node: str) -> list[tuple[api.LaunchOrder, bytes]]:
    """Every launch order on a node's work subject so far (the stream keeps them), with their bytes."""

    async def read() -> list[tuple[api.LaunchOrder, bytes]]:
        nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="test")
        try:
            js = nc.jetstream()
            sub = await js.subscribe(subjects.work_subject(node), ordered_consumer=True)
            out = []
            while True:
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except TimeoutError:
                    return out
                order = decode(msg.data, api.LaunchOrder | api.KillOrder)
                if isinstance(order, api.LaunchOrder):
                    out.append((order, msg.data))
        finally:
            await nc.drain()

    return asyncio.run(read())


def republish(cluster: LocalCluster, node: str, data: bytes, msg_id: str) -> None:
    """Put an order on a node's work subject again, under a new message id (not deduplicated)."""

    async def put() -> None:
        nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="test")
        try:
            await nc.jetstream().publish(subjects.work_subject(node), data, headers={"Nats-Msg-Id": msg_id})
        finally:
            await nc.drain()

    asyncio.run(put())


def last_seq(cluster: LocalCluster, subject: str) -> int:
    """Sequence of the newest log entry on ``subject`` (0 if none)."""

    async def read() -> int:
        nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="test")
        try:
            msg = await nc.jetstream().get_last_msg(subjects.EVENTS_STREAM, subject)
            return int(msg.seq or 0)
        except nats.js.errors.NotFoundError:
            return 0
        finally:
            await nc.drain()

    return asyncio.run(read())
