"""Benchmark: what the gateway's MaxSubmitJobs check costs at each submission of a user with N live jobs.

Usage: ``python bench/submit_count.py [--jobs 1000 10000 50000] [--rounds 20]``.

When a MaxSubmitJobs limit applies (a QOS's MaxSubmitJobsPerUser, an account's MaxSubmitJobs), the gateway
asks the scheduler how many pending and running jobs the user has at each submission (once per batch).
It used to ask for the jobs themselves, squeue's ``jobs`` verb with the user's name: the scheduler built a
JobInfo for each of the user's live jobs, encoded them in pages of up to 3 MiB, and the gateway decoded them
all and counted. It now asks the ``live_counts`` verb: the counts by QOS and account. Both are timed in one
process, without NATS (whose transfer of the pages is extra for the first): the scheduler's answer, its
encoding, the gateway's decoding and the count, for one user owning ``--jobs`` pending jobs among as many of
another user's (``Owners`` finds the user's jobs either way), each with its QOS, account and partition
resolved, as the gateway logs a submission.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))  # the unit tests' log builders

from builders import T0, Log, cluster, job, policy, submitted  # noqa: E402

from corral.libs.core.plan import Plan  # noqa: E402
from corral.schemas import api  # noqa: E402
from corral.schemas.codec import decode, encode  # noqa: E402
from corral.services.gateway.policy import SubmitLimit, check_submit_count  # noqa: E402
from corral.services.scheduler import views  # noqa: E402
from corral.services.scheduler.owners import Owners  # noqa: E402

LIMIT = [SubmitLimit("normal", None, 10**9, "QOS normal MaxSubmitJobsPerUser")]
POLICY = policy()


def by_jobs(log: Log, owners: Owners, user: str) -> tuple[int, int]:
    """The old ask: every page of the user's live jobs (``jobs``), decoded, counted; (bytes, jobs)."""
    request = api.JobsRequest(users=[user], states=["PENDING", "RUNNING"])
    infos: list[api.JobInfo] = []
    size = 0
    while True:
        data = encode(views.jobs_reply(log.state, Plan(), POLICY, request, T0 + 100, owners))
        size += len(data)
        reply = decode(data, api.JobsReply | api.ApiError)
        assert isinstance(reply, api.JobsReply)
        infos.extend(reply.jobs)
        if not reply.more or not reply.jobs:
            break
        request = msgspec.structs.replace(request, after_job_id=reply.jobs[-1].job_id)
    check_submit_count(LIMIT, [(i.qos, i.account, 1) for i in infos if i.state in ("PENDING", "RUNNING")], 1)
    return size, len(infos)


def by_count(log: Log, owners: Owners, user: str) -> tuple[int, int]:
    """The new ask: the ``live_counts`` reply, decoded, checked; (reply's bytes, jobs counted)."""
    data = encode(views.live_counts_reply(log.state, POLICY, api.LiveCountsRequest(user=user), owners))
    reply = decode(data, api.LiveCountsReply | api.ApiError)
    assert isinstance(reply, api.LiveCountsReply)
    counted = [(c.qos, c.account, c.jobs) for c in reply.counts]
    check_submit_count(LIMIT, counted, 1)
    return len(data), sum(c.jobs for c in reply.counts)


def main() -> int:
    """For each N: build the state, time both asks alternately, print a Markdown row."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10_000, 50_000])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print("| user's live jobs | ask | reply bytes | ms a submission (median) | p95 |")
    print("|---|---|---|---|---|")
    for n in args.jobs:
        log = Log(*cluster(nodes=2))
        for job_id in range(1, 2 * n + 1):
            user = "alice" if job_id % 2 else "bob"
            spec = job(gpus=1, nodes=1, qos="normal", account=user, partition="gpu")  # as the gateway logs it
            log.add(submitted(job_id, spec, user=user))
        owners = Owners()
        owners.rebuild(log.state)
        times: dict[str, list[float]] = {"jobs (before)": [], "live_counts (after)": []}
        sizes: dict[str, int] = {}
        for _ in range(args.rounds):
            for name, ask in (("jobs (before)", by_jobs), ("live_counts (after)", by_count)):
                started = time.perf_counter()
                size, counted = ask(log, owners, "alice")
                times[name].append(time.perf_counter() - started)
                assert counted == n, (name, counted)
                sizes[name] = size
        for name, samples in times.items():
            samples.sort()
            median = samples[len(samples) // 2] * 1000
            p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))] * 1000
            print(f"| {n:,} | {name} | {sizes[name]:,} | {median:.3f} | {p95:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
