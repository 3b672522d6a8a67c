"""``python -m corral.services.feed``: project the log into the job event feed."""

from __future__ import annotations

from corral.libs.runtime.service import run
from corral.services.feed.app import main

if __name__ == "__main__":
    raise SystemExit(run("feed", main))
