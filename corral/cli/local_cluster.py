"""A whole local cluster of real processes: NATS, PostgreSQL, every service and N agents.

``corral up`` runs one in the foreground; the end-to-end tests and ``corral demo`` start one too.
Everything lives in one state directory, so starting again on the same directory keeps every job:

    <state>/cluster.toml           the cluster configuration (written on first start)
    <state>/credentials/<user>.json  the local user's credentials (0600), found by the commands (and those
                                   of the ``guests``, other users who may use it too)
    <state>/credentials/roles/      one credentials file per service role and agent, and the auditor's (0600)
    <state>/credentials/service-accounts/<name>.json  each ``[[service_accounts]]``'s (0600; ``corral
                                   serviceaccount add`` writes it, the next start gives it its NATS user)
    <state>/auth/, <state>/authd.sock  the ticket and issuer keys, and authd's socket (``local_auth.py``)
    <state>/nats/  <state>/postgres/  the servers' data
    <state>/agents/<node>/          each agent's run records, job scripts and run status files
    <state>/logs/<service>.log      each process's JSON log
    <state>/metrics.json            where each process serves its Prometheus metrics: {name: URL}
    <state>/prometheus-targets.json the same for Prometheus (file_sd; infra/prometheus/prometheus.yml)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from corral.cli import up_marker
from corral.cli.local_auth import LocalAuth
from corral.cli.local_nats import nats_servers
from corral.cli.local_processes import Process, Supervised
from corral.cli.local_ready import wait_ready
from corral.libs.config import otlp, settings
from corral.libs.config.cluster import ClusterConfig, load_config, local_config_text
from corral.libs.infra import NatsServer, NatsUser, PostgresServer, roles
from corral.libs.infra.nats_server import Callout
from corral.libs.infra.ports import free_port
from corral.libs.runtime.credentials import Credentials, new_password, read_credentials, write_credentials
from corral.libs.runtime.streams import connect, declare
from corral.services.agent.stop_all import kill_runs

HOSTS_MARK = "# corral local cluster"
#: The accounting processes of ``--ha``, by ``--replica`` (one without): each projects a partition of the
#: ``[accounting] partitions`` the configuration of an ``--ha`` cluster sets to as many.
ACCOUNTING_REPLICAS = ("accounting", "accounting-2")


@dataclass
class LocalCluster(Supervised):
    """A local cluster in ``state_dir``."""

    state_dir: Path  # everything lives here
    user: str  # the Unix user who may use it
    guests: tuple[str, ...] = ()  # other users who may use it (their credentials beside the user's)
    nodes: int = 2  # agents (simulated GPU nodes) on first start
    gpus_per_node: int = 4  # GPUs per node on first start
    node_prefix: str = "node"  # node names: <prefix>1 .. <prefix>N
    config: ClusterConfig | None = None  # loaded configuration
    ha: bool = (
        False  # three clustered NATS servers (streams at 3 replicas), two of each service but the tracer
    )
    nats: NatsServer | None = None  # the NATS server (the first of three with ``ha``)
    nats_peers: list[NatsServer] = field(default_factory=list)  # the other two with ``ha``
    postgres: PostgresServer | None = None  # the PostgreSQL server
    processes: list[Process] = field(default_factory=list)  # services and agents
    metrics: bool = True  # each process serves Prometheus metrics on a free port of 127.0.0.1 (False: none)
    metrics_urls: dict[str, str] = field(default_factory=dict)  # where, by process name (also metrics.json)
    #: ``[cluster] allow_root_jobs`` of the configuration it writes (None: when started by root, whose every
    #: job is root's; a configuration already there is kept as it is)
    allow_root_jobs: bool | None = None
    auth_socket: Path | None = None  # where authd listens (default <state>/authd.sock)
    node_timeout: int = 6  # ``[cluster] node_timeout`` (s) of the configuration it writes (the demo's is 4)
    backfill_resolution: int | None = None  # ``[scheduler] backfill_resolution`` it writes (None: default)

    @property
    def config_path(self) -> Path:
        """The cluster TOML."""
        return self.state_dir / "cluster.toml"

    @property
    def user_credentials(self) -> Path:
        """The local user's credentials file (what the commands look for)."""
        return self.credentials_of(self.user)

    @property
    def metrics_file(self) -> Path:
        """Where the metrics URLs are written (``{process name: URL}``), for tools and tests."""
        return self.state_dir / "metrics.json"

    @property
    def auth(self) -> LocalAuth:
        """The ticket and callout keys, and where authd listens (``auth_socket``, else
        ``<state>/authd.sock``)."""
        return LocalAuth(self.state_dir, self.auth_socket or self.state_dir / "authd.sock")

    def role_credentials(self, role: str) -> Path:
        """A role's credentials file."""
        return self.state_dir / "credentials" / "roles" / f"{role}.json"

    # configuration --------------------------------------------------------------------------------
    def prepare(self, reconfigure: bool = False) -> ClusterConfig:
        """Write the configuration on first start (or when asked) and load it."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if reconfigure or not self.config_path.exists():
            names = [f"{self.node_prefix}{i}" for i in range(1, self.nodes + 1)]
            cpus = max(os.cpu_count() or 2, 2) * 4
            # With --ha two accounting processes share the projection, a partition each.
            shared = len(ACCOUNTING_REPLICAS) if self.ha else 1
            root = os.geteuid() == 0 if self.allow_root_jobs is None else self.allow_root_jobs
            if root:
                print(
                    "corral: warning: started by root: root's jobs are allowed, and run as root\n"
                    f"  ([cluster] allow_root_jobs = true in {self.config_path})",
                    file=sys.stderr,
                )
            self.config_path.write_text(
                local_config_text(
                    "local",
                    names,
                    self.gpus_per_node,
                    cpus,
                    64 * 1024,
                    accounting_partitions=shared,
                    allow_root_jobs=root,
                    node_timeout=self.node_timeout,
                    backfill_resolution=self.backfill_resolution,
                )
            )
        self.config = load_config(self.config_path)
        self._open_to_jobs()
        return self.config

    def _open_to_jobs(self) -> None:
        """Started by root, the agents run jobs as their users, who must reach the scripts in the agents'
        directories (``<state>/agents/<node>/jobs/<run>/script``, as Slurm's SlurmdSpoolDir): the state
        directory becomes traversable (0711, not listable), and everything else in it stays its owner's."""
        if os.geteuid() != 0:
            return
        self.state_dir.chmod(0o711)
        agents = self.state_dir / "agents"
        agents.mkdir(mode=0o711, exist_ok=True)
        agents.chmod(0o711)
        for entry in self.state_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink() and entry != agents:
                entry.chmod(0o700)

    def _password(self, role: str, path: Path) -> str:
        if path.exists():
            return read_credentials(path).password
        return new_password()

    def nats_users(self) -> list[NatsUser]:
        """Every static NATS user of the cluster, with the passwords of their credentials files (new ones
        for those without)."""
        assert self.config is not None
        users = []
        for role in roles.SERVICE_ROLES:
            users.append(roles.service_user(role, self._password(role, self.role_credentials(role))))
        for node in self.config.nodes:
            role = roles.agent_role(node.name)
            users.append(roles.agent_user(node.name, self._password(role, self.role_credentials(role))))
        users.append(roles.auditor_user(self._password(roles.AUDITOR, self.role_credentials(roles.AUDITOR))))
        for name in (self.user, *self.guests):
            users.append(roles.user_user(name, self._password(name, self.credentials_of(name))))
        for sa in self.config.service_accounts:
            path = service_account_credentials(self.state_dir, sa.name)
            users.append(roles.service_account_user(sa, self._password(sa.login, path)))
        return users

    def callout(self) -> Callout:
        """The servers' auth callout (``LocalAuth.callout``), with the system user's password."""
        return self.auth.callout(self._password(roles.SYSTEM, self.role_credentials(roles.SYSTEM)))

    def refresh_nats_users(self) -> None:
        """Give the NATS servers the logins of the credentials files as they are now (before a restart)."""
        users, callout = tuple(self.nats_users()), self.callout()
        for server in (self.nats, *self.nats_peers):
            if server is not None:
                server.users, server.callout = users, callout

    def credentials_of(self, name: str) -> Path:
        """The credentials file of the user or of one of the guests."""
        return self.state_dir / "credentials" / f"{name}.json"

    def _write_credentials(self, users: list[NatsUser], url: str) -> None:
        people = {self.user, *self.guests}
        accounts = {sa.login: sa.name for sa in self.config.service_accounts} if self.config else {}
        for user in users:
            if user.user in accounts:
                path = service_account_credentials(self.state_dir, accounts[user.user])
            elif user.user in people:
                path = self.credentials_of(user.user)
            else:
                path = self.role_credentials(user.user)
            write_credentials(path, Credentials(url=url, user=user.user, password=user.password))

    # start / stop --------------------------------------------------------------------------------
    def start(self, ready_timeout: float = 60.0) -> None:
        """Start servers, declare streams, start services and agents, wait until nodes registered. A start
        that fails (a service exits, the cluster is not ready in time) stops what it started first: no
        server, service or agent of a cluster that did not come up keeps running."""
        config = self.config or self.prepare()
        up_marker.mark_up(self.state_dir)
        try:
            self._start(config, ready_timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, config: ClusterConfig, ready_timeout: float) -> None:
        users = self.nats_users()
        callout = self.callout()
        servers = nats_servers(self.state_dir, users, self.ha, callout)
        for server in servers:
            server.start()
        self.nats, self.nats_peers = servers[0], servers[1:]
        url = ",".join(server.url for server in servers)
        self._write_credentials([*users, callout.system], url)
        readers = roles.feed_readers(config.service_accounts)
        asyncio.run(self._declare([node.name for node in config.nodes], readers, replicas=len(servers)))
        self.postgres = PostgresServer(self.state_dir / "postgres")
        self.postgres.start()
        (self.state_dir / "logs").mkdir(mode=0o700, exist_ok=True)
        replicas = (
            ("gateway-2", "health-2", "scheduler-2", "feed-2", "auth-2", *ACCOUNTING_REPLICAS[1:])
            if self.ha
            else ()
        )
        services = (
            "auth",
            "accounting",
            "scheduler",
            "gateway",
            "health",
            "feed",
            *replicas,
            *self._optional_services(),
        )
        for name in services:
            role = f"corral-{name.split('-')[0]}"
            extra, secrets = [], {}
            if name in ACCOUNTING_REPLICAS:
                # The DSN holds the database password: in the environment (readable by its owner only),
                # not on the command line every local user can read in ps.
                extra, secrets = (
                    ["--replica", str(ACCOUNTING_REPLICAS.index(name))],
                    {"CORRAL_DATABASE_URL": self.postgres.dsn},
                )
            if name.startswith("gateway"):
                extra = ["--admin", roles.ADMIN, "--auditor", roles.AUDITOR]
            if name.startswith("auth"):
                extra = self.auth.service_flags()
            if name == "scheduler-2":
                extra = ["--name", f"{socket.gethostname()}-2"]  # a standby (the lease names each scheduler)
            self._spawn(name, role, f"corral.services.{name.split('-')[0]}", extra, secrets)
        for node in config.nodes:
            role = roles.agent_role(node.name)
            agent_dir = self.state_dir / "agents" / node.name
            self._spawn(
                role, role, "corral.services.agent", ["--node", node.name, "--state-dir", str(agent_dir)]
            )
        argv = self.auth.authd_argv(url)  # other local users' way in
        self.processes.append(Process("authd", argv, self._popen("authd", argv)))
        self._write_metrics_files()
        self.wait_ready(ready_timeout)

    @staticmethod
    def _optional_services() -> tuple[str, ...]:
        """The tracer, when spans have somewhere to go (the OTEL_EXPORTER_OTLP_* variables name a target)."""
        return ("tracer",) if otlp.target(settings.from_env()) is not None else ()

    async def _declare(self, nodes: list[str], readers: dict[str, list[str]], replicas: int = 1) -> None:
        assert self.nats is not None
        creds = read_credentials(self.role_credentials(roles.ADMIN))
        nc = await connect(creds, name="corral-up")
        try:
            # A new cluster elects its JetStream leader within seconds of its servers' start.
            deadline = time.monotonic() + 30
            while True:
                try:
                    await declare(nc.jetstream(), replicas=replicas, nodes=nodes, feed_readers=readers)
                    return
                except Exception:
                    if replicas == 1 or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        finally:
            await nc.drain()

    def _write_metrics_files(self) -> None:
        """``metrics.json`` ({name: URL}) and ``prometheus-targets.json`` (Prometheus' file_sd format)."""
        urls = self.metrics_urls
        targets = [
            {"targets": [url.split("/")[2]], "labels": {"service": name.split("-", 1)[0], "instance": name}}
            for name, url in urls.items()
        ]
        for path, value in ((self.metrics_file, urls), (self.state_dir / "prometheus-targets.json", targets)):
            path.write_bytes(msgspec.json.format(msgspec.json.encode(value)) + b"\n")

    def _spawn(
        self, name: str, role: str, module: str, extra: list[str], secrets: dict[str, str] | None = None
    ) -> None:
        # A port chosen here, not by the process: the URL is known before it starts and stays the same
        # when a test kills and revives it (the same command line).
        port = free_port() if self.metrics else None
        if port is not None:
            self.metrics_urls[name] = f"http://127.0.0.1:{port}/metrics"
        argv = [
            sys.executable,
            "-m",
            module,
            "--credentials",
            str(self.role_credentials(role)),
            "--config",
            str(self.config_path),
            "--metrics-port",
            "off" if port is None else str(port),
            *extra,
        ]
        secrets = secrets or {}
        self.processes.append(Process(name, argv, self._popen(name, argv, secrets), secrets))

    def wait_ready(self, timeout: float) -> None:
        """Wait until every configured node is registered and idle or busy in sinfo's view, and the gateway
        and accounting answer too (``local_ready.py``)."""
        wait_ready(self, timeout)

    def spawn_scheduler(self, name: str) -> str:
        """Start one more scheduler, named ``name`` in the lease and in ``scontrol ping`` (a standby while
        another holds the lease); returns its process name, ``scheduler-<name>``."""
        process = f"scheduler-{name}"
        self._spawn(process, roles.SCHEDULER, "corral.services.scheduler", ["--name", name])
        return process

    def stop(self, kill_jobs: bool = True) -> None:
        """Stop agents first, then services, then the servers.

        Agents stop without killing their jobs (slurmd's way: a restarted agent re-adopts them). Stopping the
        whole local cluster kills them too unless ``kill_jobs`` is False: nothing of the cluster should keep
        running on the machine once ``corral up`` has exited. They are marked killed, so the next start
        reports them killed and the scheduler requeues them (a ``--no-requeue`` job ends NODE_FAIL).
        """
        with contextlib.suppress(OSError):
            up_marker.mark_stopped(self.state_dir)  # commands from now on say so at once
        kill_wait = self.config.kill_wait_s if self.config else 5.0

        def after_agents() -> None:
            if kill_jobs:
                kill_runs(self.state_dir / "agents", kill_wait)

        self.stop_processes(after_agents)
        self.processes.clear()
        self.metrics_urls.clear()
        if self.postgres is not None:
            self.postgres.stop()
        for server in (*self.nats_peers, self.nats):
            if server is not None:
                server.stop()


def service_account_credentials(state_dir: Path, name: str) -> Path:
    """The credentials file of the service account ``name``."""
    return state_dir / "credentials" / "service-accounts" / f"{name}.json"


def ensure_resolvable(names: list[str]) -> str | None:
    """Make node names resolve to this machine; returns a warning if they cannot be made to.

    Jobs use the first node name as their rendezvous address (MASTER_ADDR), so every simulated
    node's name must resolve here. When they do not and ``/etc/hosts`` is writable (root), a marked
    line maps them to 127.0.0.1.
    """
    missing = []
    for name in names:
        try:
            socket.gethostbyname(name)
        except OSError:
            missing.append(name)
    if not missing:
        return None
    hosts = Path("/etc/hosts")
    if os.access(hosts, os.W_OK):
        with contextlib.suppress(OSError), hosts.open("a") as fh:
            fh.write(f"127.0.0.1 {' '.join(missing)} {HOSTS_MARK}\n")
            return None
    return (
        f"node names {', '.join(missing)} do not resolve on this machine; multi-node jobs that "
        f"rendezvous on the first node name will fail. Add '127.0.0.1 {' '.join(missing)}' to /etc/hosts."
    )
