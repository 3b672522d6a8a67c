"""``python -m corral.services.tracer``: run the trace exporter (needs an OTLP endpoint)."""

from __future__ import annotations

import argparse

from corral.libs.runtime.service import run
from corral.services.tracer.app import CONSUMER, main


def _flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--consumer",
        default=CONSUMER,
        help=f"durable consumer name (default {CONSUMER}; a new name exports the whole log again)",
    )


if __name__ == "__main__":
    raise SystemExit(run("tracer", main, extra=_flags))
