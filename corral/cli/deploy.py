"""``corral deploy init DIR``: everything a cluster of several machines needs, written into one directory.

- ``cluster.toml``: the nodes (a Slurm hostlist, ``gpu[001-016]``), their GPUs, CPUs and memory, one
  partition;
- ``credentials/roles/<role>.json`` (0600): a fresh password per service role, per agent and for the admin
  and auditor, each naming every NATS server of the cluster (the clients fail over between them), and
  ``credentials/<user>.json`` for each ``--user``;
- ``nats/nats-<i>.conf``: three NATS servers with JetStream, routes to each other, and each role's subject
  permissions (``libs/infra/roles.py``, rendered as ``corral up`` renders them);
- ``env``: what every service reads (``CORRAL_CLUSTER_CONFIG``, ``CORRAL_DATABASE_URL`` with a fresh
  password, ``OTEL_EXPORTER_OTLP_ENDPOINT`` when given), for systemd's ``EnvironmentFile`` and compose's
  ``env_file``; the password is in this file, not on a command line;
- ``auth/ticket.key`` and ``auth/issuer.nk`` (0600): the ticket key ``corral authd`` signs with and the auth
  callout checks (copy it to every host, as ``munge.key``), and the callout's issuer nkey; the servers hand
  every login but the static ones to the callout (``docs/decisions/identity.md``), and
  ``credentials/roles/corral-system.json`` is the system account's user (revocation, reloads);
- ``systemd/``: a unit per service, ``corral-agent@.service`` and ``corral-authd.service`` (root, on every
  login and compute host: ``/run/corral/authd.sock``);
- ``compose.yaml`` (``deploy_compose.py``): the same layout as containers, built from the source tree by
  ``infra/Dockerfile`` (nothing is installed into a read-only mount), with a one-shot ``declare`` service
  that declares the streams and buckets with 3 replicas before the services start.

Paths inside the files are the ones the services see: ``ROOT`` (``/etc/corral``), which is ``DIR`` itself on
a machine (copy it there) and a read-only mount of it in compose.
"""

from __future__ import annotations

import argparse
import dataclasses
import secrets
import sys
from pathlib import Path

from corral.cli.authd import DEFAULT_SOCKET as AUTH_SOCKET
from corral.cli.deploy_compose import SERVICES, compose_text, service_command
from corral.cli.local_auth import LocalAuth
from corral.libs.config.cluster import local_config_text
from corral.libs.infra import roles
from corral.libs.infra.managed import write_private
from corral.libs.infra.nats_server import NatsUser, Routes, render_config
from corral.libs.runtime.credentials import Credentials, new_password, write_credentials
from corral.libs.slurm import hostlist
from corral.libs.slurm.errors import FormatError

#: Where the directory is, as the services see it.
ROOT = "/etc/corral"
#: The NATS servers of a deployment.
NATS_SERVERS = 3


@dataclasses.dataclass(frozen=True)
class Layout:
    """What ``init`` was asked for."""

    name: str  # the cluster's name
    nodes: list[str]  # the GPU nodes
    gpus_per_node: int
    gpu_type: str
    cpus: int
    memory_mb: int
    nats_hosts: list[str]  # the three NATS servers' host names
    nats_port: int  # client port of the first server; the others take the next ones
    route_port: int  # route port of the first server; likewise
    postgres_host: str
    postgres_port: int
    metrics_port: int  # the gateway's; scheduler, accounting, health and each agent take the next ones
    users: list[str]  # people who get credentials
    otlp: str | None  # OTEL_EXPORTER_OTLP_ENDPOINT of the services, if any
    source: Path  # the source tree the image is built from

    def client_url(self) -> str:
        """Every NATS server's client URL, comma-separated."""
        return ",".join(f"nats://{h}:{self.nats_port + i}" for i, h in enumerate(self.nats_hosts))

    def metrics(self, service: str) -> int:
        """The metrics port of a service (``agent-<node>`` for an agent)."""
        if service.startswith("agent-"):
            return self.metrics_port + len(SERVICES) + self.nodes.index(service.removeprefix("agent-"))
        return self.metrics_port + SERVICES.index(service)


def users_of(layout: Layout, password: dict[str, str]) -> list[NatsUser]:
    """Every NATS login of the deployment, with its permissions."""
    users = [roles.service_user(role, password[role]) for role in roles.SERVICE_ROLES]
    users += [roles.agent_user(node, password[roles.agent_role(node)]) for node in layout.nodes]
    users.append(roles.auditor_user(password[roles.AUDITOR]))
    users += [roles.user_user(name, password[name]) for name in layout.users]
    return users


def init(target: Path, layout: Layout) -> list[Path]:
    """Write the deployment into ``target`` (which must not hold one yet); the files written."""
    if (target / "cluster.toml").exists():
        raise FileExistsError(
            f"{target} already holds a deployment (cluster.toml); choose an empty directory"
        )
    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    written: list[Path] = []
    names = [*roles.SERVICE_ROLES, *(roles.agent_role(n) for n in layout.nodes), roles.AUDITOR, *layout.users]
    password = {name: new_password() for name in names}
    config = target / "cluster.toml"
    config.write_text(
        local_config_text(
            layout.name, layout.nodes, layout.gpus_per_node, layout.cpus, layout.memory_mb, layout.gpu_type
        )
    )
    written.append(config)
    people = set(layout.users)
    for name in names:
        path = target / "credentials" / (f"{name}.json" if name in people else f"roles/{name}.json")
        write_credentials(path, Credentials(url=layout.client_url(), user=name, password=password[name]))
        written.append(path)
    users = users_of(layout, password)
    auth = LocalAuth(target, Path(AUTH_SOCKET))
    system_password = new_password()
    callout = auth.callout(system_password)
    system_creds = target / "credentials" / "roles" / f"{roles.SYSTEM}.json"
    write_credentials(
        system_creds, Credentials(url=layout.client_url(), user=roles.SYSTEM, password=system_password)
    )
    written += [auth.ticket_key, auth.issuer_seed, system_creds]
    routes = [f"nats-route://{h}:{layout.route_port + i}" for i, h in enumerate(layout.nats_hosts)]
    (target / "nats").mkdir(exist_ok=True)
    for i in range(len(layout.nats_hosts)):
        conf = target / "nats" / f"nats-{i + 1}.conf"
        cluster = Routes(name=layout.name, listen=f"0.0.0.0:{layout.route_port + i}", routes=routes)
        text = render_config(
            f"{layout.name}-nats-{i + 1}",
            f"0.0.0.0:{layout.nats_port + i}",
            f"nats-{i + 1}",  # relative to the working directory, /var/lib/corral (a volume in compose)
            users,
            cluster=cluster,
            callout=callout,
        )
        write_private(conf, text)
        written.append(conf)
    db_password = secrets.token_urlsafe(24)
    env = {
        "CORRAL_CLUSTER_CONFIG": f"{ROOT}/cluster.toml",
        "CORRAL_DATABASE_URL": (
            f"postgresql://corral:{db_password}@{layout.postgres_host}:{layout.postgres_port}/corral"
        ),
        "POSTGRES_USER": "corral",
        "POSTGRES_PASSWORD": db_password,
        "POSTGRES_DB": "corral",
    }
    if layout.otlp:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = layout.otlp
    write_private(target / "env", "".join(f"{k}={v}\n" for k, v in env.items()))
    written.append(target / "env")
    (target / "systemd").mkdir(exist_ok=True)
    for service in (*SERVICES, "agent"):
        unit = (
            target
            / "systemd"
            / (f"corral-{service}.service" if service != "agent" else "corral-agent@.service")
        )
        unit.write_text(_unit(layout, service))
        written.append(unit)
    authd = target / "systemd" / "corral-authd.service"
    authd.write_text(_authd_unit(layout))
    written.append(authd)
    compose = target / "compose.yaml"
    compose.write_text(compose_text(layout, ROOT))
    written.append(compose)
    return written


def _unit(layout: Layout, service: str) -> str:
    """A systemd unit: the service from ``/opt/corral/venv`` with ``ROOT``'s files, restarted always."""
    if service == "agent":
        # One agent per machine: every node's unit serves its metrics on the same port.
        argv = service_command(
            "agent", layout, ROOT, node="%i", metrics_port=layout.metrics_port + len(SERVICES)
        )
        description = "Corral agent of node %i"
    else:
        argv = service_command(service, layout, ROOT)
        description = f"Corral {service}"
    argv = ["/opt/corral/venv/bin/python", *argv[1:]]
    # The agent runs jobs; the auth callout reads the ticket key, which is root's alone.
    user = "root" if service in ("agent", "auth") else "corral"
    return (
        f"# Written by corral deploy init.\n[Unit]\nDescription={description}\n"
        "After=network-online.target\nWants=network-online.target\n\n"
        f"[Service]\nUser={user}\nEnvironmentFile={ROOT}/env\n"
        "StateDirectory=corral\nWorkingDirectory=/var/lib/corral\n"
        f"ExecStart={' '.join(argv)}\nRestart=always\nRestartSec=2\nKillSignal=SIGTERM\nTimeoutStopSec=30\n"
        "\n[Install]\nWantedBy=multi-user.target\n"
    )


def _authd_unit(layout: Layout) -> str:
    """The unit of ``corral authd``: root (it reads the ticket key), its socket in ``/run/corral``."""
    argv = ["/opt/corral/venv/bin/python", "-m", "corral.cli.authd", "--socket", AUTH_SOCKET]
    argv += ["--key", f"{ROOT}/auth/ticket.key", "--url", layout.client_url()]
    return (
        "# Written by corral deploy init.\n[Unit]\nDescription=Corral authd (local users' tickets)\n\n"
        "[Service]\nUser=root\nRuntimeDirectory=corral\nRuntimeDirectoryMode=0755\n"
        f"ExecStart={' '.join(argv)}\nRestart=always\nRestartSec=2\n"
        "\n[Install]\nWantedBy=multi-user.target\n"
    )


def _source_tree() -> Path:
    """The source checkout this command runs from (where ``pyproject.toml`` is)."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").exists() else Path.cwd()


def main(argv: list[str]) -> int:
    """``corral deploy init DIR ...``."""
    p = argparse.ArgumentParser(prog="corral deploy", description="write a multi-machine deployment")
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("init", help="write cluster config, credentials, NATS, systemd and compose files")
    i.add_argument("dir", type=Path, help="an empty directory to write into")
    i.add_argument("--nodes", required=True, help="the GPU nodes, a hostlist (gpu[001-016])")
    i.add_argument("--gpus-per-node", type=int, default=8)
    i.add_argument("--gpu-type", default="gpu", help="the GPUs' type (a100, h100 ...)")
    i.add_argument("--cpus-per-node", type=int, default=64)
    i.add_argument("--memory-per-node", type=int, default=512 * 1024, help="MB")
    i.add_argument("--name", default="corral", help="the cluster's name")
    i.add_argument("--nats-hosts", default="nats-1,nats-2,nats-3", help="the three NATS servers")
    i.add_argument("--nats-port", type=int, default=4222, help="client port of the first (the next +1, +2)")
    i.add_argument("--route-port", type=int, default=6222, help="route port of the first (the next +1, +2)")
    i.add_argument("--postgres", default="postgres:5432", help="PostgreSQL host:port")
    i.add_argument("--metrics-port", type=int, default=9471, help="the gateway's; the others the next ones")
    i.add_argument("--user", action="append", default=[], help="a person to write credentials for")
    i.add_argument("--otlp", default=None, help="OTEL_EXPORTER_OTLP_ENDPOINT of the services")
    d = sub.add_parser("declare", help="declare the streams and buckets (the admin role)")
    d.add_argument("--credentials", type=Path, required=True, help="the admin's credentials file")
    d.add_argument("--config", type=Path, required=True, help="the cluster config (its nodes' consumers)")
    d.add_argument("--replicas", type=int, default=3)
    args = p.parse_args(argv)
    if args.command == "declare":
        return _declare(args.credentials, args.config, args.replicas)
    try:
        nodes = hostlist.expand(args.nodes, "--nodes")
    except FormatError as exc:
        print(f"corral deploy: {exc}", file=sys.stderr)
        return 2
    hosts = [h.strip() for h in args.nats_hosts.split(",") if h.strip()]
    if len(hosts) != NATS_SERVERS:
        print(
            f"corral deploy: --nats-hosts names {len(hosts)} servers; it needs {NATS_SERVERS}",
            file=sys.stderr,
        )
        return 2
    pg_host, _, pg_port = args.postgres.rpartition(":")
    if not pg_host or not pg_port.isdigit():
        print(
            f"corral deploy: --postgres {args.postgres!r} is not host:port (e.g. postgres:5432)",
            file=sys.stderr,
        )
        return 2
    layout = Layout(
        name=args.name,
        nodes=nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_type=args.gpu_type,
        cpus=args.cpus_per_node,
        memory_mb=args.memory_per_node,
        nats_hosts=hosts,
        nats_port=args.nats_port,
        route_port=args.route_port,
        postgres_host=pg_host,
        postgres_port=int(pg_port),
        metrics_port=args.metrics_port,
        users=args.user,
        otlp=args.otlp,
        source=_source_tree(),
    )
    try:
        written = init(args.dir, layout)
    except FileExistsError as exc:
        print(f"corral deploy: {exc}", file=sys.stderr)
        return 1
    print(f"corral deploy: wrote {len(written)} files into {args.dir} for {len(nodes)} nodes")
    print(f"  start it with: docker compose -f {args.dir / 'compose.yaml'} up --build")
    return 0


def _declare(credentials: Path, config: Path, replicas: int) -> int:
    import asyncio

    from corral.libs.config.cluster import load_config
    from corral.libs.runtime.credentials import read_credentials
    from corral.libs.runtime.streams import connect, declare

    parsed = load_config(config)
    nodes = [node.name for node in parsed.nodes]

    async def run() -> None:
        nc = await connect(read_credentials(credentials), name="corral-deploy-declare")
        try:
            await declare(
                nc.jetstream(),
                replicas=replicas,
                nodes=nodes,
                feed_readers=roles.feed_readers(parsed.service_accounts),
            )
        finally:
            await nc.drain()

    asyncio.run(run())
    print(
        f"corral deploy: streams, buckets and {len(nodes)} work consumers declared with {replicas} replicas",
        file=sys.stderr,
    )
    return 0
