"""Benchmark: every page of a plain ``squeue`` (the ``jobs`` verb, no ``-j`` nor ``-u``) over N pending jobs.

Usage: ``python bench/squeue_pages.py [--jobs 100000 400000] [--expanded]``.

The state is ``rebuild.py``'s (pending training jobs of 400 users on 100 nodes, folded from their
submissions); every page is asked in turn, each after the last job of the one before, as the command's
client does, in process (no NATS). Timed both ways in one process: with the order of the state's job ids the
scheduler keeps for the log position (``views.JobOrder``), and without it (each page a pass over every job
and a sort of the rest, as before). ``--expanded``: a row per array task (``squeue -r``) instead of the
default's alike pending tasks as one row. Prints the pages, the total and the slowest page.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from rebuild import config_text, log_entries

from corral.libs.config.cluster import parse_config
from corral.libs.config.policy import policy_of
from corral.libs.core import fold
from corral.libs.core.plan import Plan
from corral.libs.core.state import State
from corral.schemas import api
from corral.schemas.codec import decode_slim_envelope
from corral.services.scheduler import views


def pages(state: State, collapse: bool, order: views.JobOrder | None) -> tuple[int, float, float]:
    """(pages, total seconds, slowest page's seconds) of one whole listing."""
    policy, outlook, after = policy_of(parse_config(config_text(100))), Plan(), 0
    count, worst, began = 0, 0.0, time.perf_counter()
    while True:
        request = api.JobsRequest(after_job_id=after, collapse_arrays=collapse)
        started = time.perf_counter()
        reply = views.jobs_reply(state, outlook, policy, request, time.time(), None, order)
        worst = max(worst, time.perf_counter() - started)
        count += 1
        if not reply.more:
            return count, time.perf_counter() - began, worst
        after = reply.last_job_id if collapse else reply.jobs[-1].job_id


def main() -> int:
    """Build each state, time both ways, print a line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100_000, 400_000])
    parser.add_argument("--expanded", action="store_true", help="a row per array task (squeue -r)")
    args = parser.parse_args()
    for n in args.jobs:
        state = State()
        for seq, (_, _, data) in enumerate(log_entries(n + 100, 100), start=1):
            fold.apply(state, seq, decode_slim_envelope(data))
        gc.collect()
        gc.freeze()  # as the scheduler's rebuilt state
        for label, order in (("every job each page", None), ("kept job order", views.JobOrder())):
            count, total, worst = pages(state, not args.expanded, order)
            slowest = f"slowest page {worst * 1e3:5.0f} ms"
            print(f"{n:>9,} jobs  {label:<20} {count:>4} pages  {total:6.2f} s  {slowest}")
        del state
        gc.unfreeze()
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
