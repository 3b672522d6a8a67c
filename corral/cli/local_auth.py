"""The local cluster's identity pieces (docs/decisions/identity.md): the ticket key, the auth callout's
issuer key, the system account's user and ``corral authd``.

    <state>/auth/ticket.key   the ticket key authd signs with and the auth callout checks (0600)
    <state>/auth/issuer.nk    the account nkey seed the auth callout signs user JWTs with (0600)
    <state>/authd.sock        where authd gives local users a ticket (``corral up --auth-socket`` elsewhere)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from corral.libs.infra import NatsUser, roles
from corral.libs.infra.managed import write_private
from corral.libs.infra.nats_server import Callout
from corral.libs.runtime import nats_jwt, tickets


@dataclass(frozen=True)
class LocalAuth:
    """Where a local cluster keeps its keys, and where its authd listens."""

    state_dir: Path  # the cluster's state directory
    socket: Path  # where authd listens

    @property
    def ticket_key(self) -> Path:
        """The ticket key file (0600): authd signs with it, the auth callout checks with it."""
        return self.state_dir / "auth" / "ticket.key"

    @property
    def issuer_seed(self) -> Path:
        """The auth callout's account nkey seed (0600)."""
        return self.state_dir / "auth" / "issuer.nk"

    def callout(self, system_password: str) -> Callout:
        """The servers' auth callout: its issuer (keys made on first start) and the system account's user."""
        tickets.ensure_keys(self.ticket_key)
        if not self.issuer_seed.exists():
            write_private(self.issuer_seed, nats_jwt.new_account_seed().decode() + "\n")
        seed = self.issuer_seed.read_bytes().strip()
        system = NatsUser(roles.SYSTEM, system_password, [], [])
        return Callout(issuer=nats_jwt.public_key(seed), system=system)

    def service_flags(self) -> list[str]:
        """The auth callout service's own flags."""
        return ["--ticket-key", str(self.ticket_key), "--issuer-seed", str(self.issuer_seed)]

    def authd_argv(self, url: str) -> list[str]:
        """``corral authd`` for the cluster at ``url``."""
        return [
            sys.executable, "-m", "corral.cli.authd", "--socket", str(self.socket),
            "--key", str(self.ticket_key), "--url", url,
        ]  # fmt: skip
