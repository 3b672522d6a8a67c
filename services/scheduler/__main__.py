"""``python -m corral.services.scheduler``: run the scheduler."""

from __future__ import annotations

from corral.libs.runtime.service import run
from corral.services.scheduler.app import main

if __name__ == "__main__":
    raise SystemExit(run("scheduler", main))
