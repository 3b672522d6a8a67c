"""``python -m corral.services.auth``: answer nats-server's authorization requests (people's tickets)."""

from __future__ import annotations

import argparse
from pathlib import Path

from corral.libs.runtime.service import run
from corral.services.auth.app import main


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ticket-key", type=Path, required=True, help="the cluster's ticket key file (0600)")
    p.add_argument(
        "--issuer-seed",
        type=Path,
        required=True,
        help="the account nkey seed the callout signs with (0600; its public key is the servers' issuer)",
    )


if __name__ == "__main__":
    raise SystemExit(run("auth", main, extra=_flags))
