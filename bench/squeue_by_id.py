"""Benchmark: ``squeue -j ID`` and ``squeue -u USER`` (the ``jobs`` verb) on a scheduler state of N jobs.

Usage: ``python bench/squeue_by_id.py [--jobs 50000] [--users 100] [--rounds 200]``.

srun asks for its job by id 50 times a second while the job waits (then 5 times a second), ``scontrol show
job ID`` and ``squeue -j`` once; users watch ``squeue --me``, and the gateway counts a user's live jobs at
each submission when a MaxSubmitJobs limit applies. Every scheduler, leader and standbys, answers each
request. The reply's jobs used to be found by a pass over every job of the state (``views.jobs_reply``); they
are looked up now (``views._candidates``: by id, or the user's from the shell's ``Owners``). Both are timed in
one process, the pass by putting the old candidates back: the mean time of one request, in process (no
NATS), for a job in the middle of the state, and for one of ``--users`` users owning as many jobs each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))  # the unit tests' log builders

from builders import T0, Log, cluster, job, policy, submitted  # noqa: E402

from corral.libs.core.plan import Plan  # noqa: E402
from corral.schemas import api  # noqa: E402
from corral.services.scheduler import views  # noqa: E402
from corral.services.scheduler.owners import Owners  # noqa: E402


def main() -> int:
    """Build the state, time both ways, print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    log = Log(*cluster(nodes=2))
    for job_id in range(1, args.jobs + 1):
        log.add(submitted(job_id, job(gpus=1, nodes=1), user=f"user{job_id % args.users}"))
    owners = Owners()
    owners.rebuild(log.state)
    requests = {
        "squeue -j ID": api.JobsRequest(job_ids=[args.jobs // 2], include_finished=True),
        "squeue -u USER": api.JobsRequest(users=["user7"]),
    }
    looked_up = views._candidates

    def every_job(state: Any, wanted: Any, users: Any = (), owned: Any = None) -> Any:
        return state.jobs.values()

    for what, request in requests.items():
        for name, candidates in (("a pass over every job", every_job), ("looked up", looked_up)):
            views._candidates = candidates
            started = time.perf_counter()
            for _ in range(args.rounds):
                reply = views.jobs_reply(log.state, Plan(), policy(), request, T0 + 100, owners)
            mean = (time.perf_counter() - started) / args.rounds
            print(
                f"{what}, {name}: {mean * 1000:.3f} ms a request, {args.jobs} jobs, {len(reply.jobs)} shown"
            )
    views._candidates = looked_up
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
