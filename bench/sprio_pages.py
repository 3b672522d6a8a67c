"""Benchmark: ``sprio`` (the ``priority`` verb) over a deep queue, every page, in process.

Usage: ``python bench/sprio_pages.py [--jobs 50000] [--users 200] [--rounds 3] [--before DIR]``.

A scheduler state of ``--jobs`` pending one-GPU jobs of ``--users`` users under multifactor priority (age,
fair share with recorded usage, job size), then what sprio asks: every page of the ``priority`` verb
(``priority_views.priority_reply``, ~10,000 rows a page under the 3 MiB bound), each encoded as the reply
is sent, until none is left; the mean seconds of that, the pages and the rows. With ``--before DIR`` the
same runs in a process importing Corral from DIR first (``git archive REV | tar -x -C DIR``), so both are
measured in one run. Results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def measure(jobs: int, users: int, rounds: int) -> str:
    """One line: the mean seconds of reading every page, in this process's code."""
    sys.path.insert(0, str(Path(__import__("corral").__file__).resolve().parents[1] / "tests" / "unit"))
    import dataclasses

    from builders import T0, Log, allocated, cluster, exited, job, partition, policy, submitted

    from corral.libs.core.plan import plan
    from corral.libs.core.priority import PriorityWeights
    from corral.schemas import api
    from corral.schemas.codec import encode
    from corral.services.scheduler.priority_views import priority_reply

    weights = PriorityWeights(age=1000, fairshare=10_000, job_size=1000, max_age_s=7 * 86400.0)
    pol = dataclasses.replace(policy(partition("gpu", max_s=86_400, default_s=3600)), weights=weights)
    log = Log(*cluster(nodes=2))
    # Usage for a tenth of the users: a job each that ran for a while on gpu01 and completed.
    for u in range(0, users, 10):
        job_id = jobs + 1 + u
        log.add(submitted(job_id, job(gpus=1, nodes=1), user=f"user{u}"))
        log.add(allocated(job_id, {"gpu01": [0]}))
        log.add(exited(job_id, "gpu01"), step=60.0 * (u + 1))
        for decision in plan(log.state, log.state.now, pol).decisions:
            log.add(decision, step=0.0)
    for job_id in range(1, jobs + 1):
        log.add(submitted(job_id, job(gpus=1, nodes=1), user=f"user{job_id % users}"), step=0.001)
    now = T0 + 3600
    pages = rows = 0
    started = time.perf_counter()
    for _ in range(rounds):
        pages = rows = 0
        request = api.PriorityRequest()
        while True:
            reply = priority_reply(log.state, pol, request, now)
            encode(reply)
            pages, rows = pages + 1, rows + len(reply.jobs)
            if not reply.more:
                break
            request = api.PriorityRequest(after_job_id=reply.jobs[-1].job_id)
    took = (time.perf_counter() - started) / rounds
    return f"{took:.3f} s, {pages} pages, {rows:,} rows"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a checkout to measure first, in its own process")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # measure here, print one line
    args = parser.parse_args()
    if args.one:
        print(measure(args.jobs, args.users, args.rounds))
        return 0
    trees = {"after": HERE.parent}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    print(f"sprio, every page: {args.jobs:,} pending jobs of {args.users} users, mean of {args.rounds} reads")
    for name, tree in trees.items():
        env = {**os.environ, "PYTHONPATH": str(tree)}
        argv = [sys.executable, str(tree / "bench" / "sprio_pages.py"), "--one"]
        argv += ["--jobs", str(args.jobs), "--users", str(args.users), "--rounds", str(args.rounds)]
        if name == "before":  # the before's checkout may not have this script: run this one on its code
            argv[1] = str(HERE / "sprio_pages.py")
        out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, check=True)
        print(f"{name}: {out.stdout.strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
