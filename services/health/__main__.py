"""``python -m corral.services.health``: run the node health monitor."""

from __future__ import annotations

from corral.libs.runtime.service import run
from corral.services.health.app import main

if __name__ == "__main__":
    raise SystemExit(run("health", main))
