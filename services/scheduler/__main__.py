"""``python -m corral.services.scheduler``: run a scheduler (the leader, or a standby of the leader)."""

from __future__ import annotations

import argparse
import socket

from corral.libs.runtime.service import run
from corral.services.scheduler.process import main


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--name",
        default=socket.gethostname(),
        help="this scheduler's name in the lease and in scontrol ping (default: the host name; give each"
        " scheduler of one host its own)",
    )


if __name__ == "__main__":
    raise SystemExit(run("scheduler", main, extra=_flags))
