"""The NATS servers of a local cluster: one, or with ``ha`` three in one JetStream cluster."""

from __future__ import annotations

from pathlib import Path

from corral.libs.infra import NatsServer, NatsUser
from corral.libs.infra.nats_server import Callout, Routes
from corral.libs.infra.ports import free_port


def nats_servers(
    state_dir: Path, users: list[NatsUser], ha: bool, callout: Callout | None = None
) -> list[NatsServer]:
    """One NATS server, or with ``ha`` three in a JetStream cluster (route ports kept across starts); each
    hands people's logins to the auth callout when given one."""
    if not ha:
        return [NatsServer(state_dir / "nats", users, callout=callout)]
    dirs = [state_dir / f"nats-{i}" for i in (1, 2, 3)]
    ports = [_route_port(d) for d in dirs]
    routes = [f"nats-route://127.0.0.1:{port}" for port in ports]
    return [
        NatsServer(
            d,
            users,
            server_name=f"corral-nats-{i}",
            routes=Routes(name="corral", listen=f"127.0.0.1:{port}", routes=routes),
            callout=callout,
        )
        for i, (d, port) in enumerate(zip(dirs, ports, strict=True), start=1)
    ]


def _route_port(data_dir: Path) -> int:
    """A cluster server's route port: the one it had, else a free one (kept in ``route-port``)."""
    path = data_dir / "route-port"
    if path.exists():
        return int(path.read_text())
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    port = free_port()
    path.write_text(f"{port}\n")
    return port
