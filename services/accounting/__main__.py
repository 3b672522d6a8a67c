"""``python -m corral.services.accounting``: run the accounting service (slurmdbd)."""

from __future__ import annotations

import argparse

from corral.libs.runtime.service import run
from corral.services.accounting.app import main


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--database-url", help="PostgreSQL DSN, postgresql://... (env CORRAL_DATABASE_URL)")
    p.add_argument(
        "--replica",
        type=int,
        default=0,
        help="this process's index among the accounting processes (0, 1, ...): it projects partition "
        "replica %% [accounting] partitions, and takes over others whose process died",
    )


if __name__ == "__main__":
    raise SystemExit(run("accounting", main, extra=_flags))
