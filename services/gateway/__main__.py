"""``python -m corral.services.gateway``: run the gateway."""

from __future__ import annotations

import argparse

from corral.libs.runtime.service import run
from corral.services.gateway.app import main


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin", action="append", help="a user with the admin role (repeatable)")
    p.add_argument(
        "--auditor",
        action="append",
        help="a user with the auditor role: reads every job's history, may change nothing (repeatable)",
    )


if __name__ == "__main__":
    raise SystemExit(run("gateway", main, extra=_flags))
