"""``python -m corral.services.agent --node NAME``: run the agent of one node."""

from __future__ import annotations

import argparse
from pathlib import Path

from corral.libs.runtime.service import run
from corral.services.agent.app import main
from corral.services.agent.crashpoints import POINTS


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", required=True, help="this node's name (as in the cluster config)")
    p.add_argument("--state-dir", type=Path, help="where the agent keeps its run records")
    p.add_argument(
        "--crash-at",
        choices=POINTS,
        help="(failure tests) die at this point of the next launch or record compaction",
    )


if __name__ == "__main__":
    raise SystemExit(run("agent", main, extra=_flags))
