"""Scheduler failover time: kill the leader with SIGKILL, again and again, and time the next decision.

Usage: ``python bench/failover.py [--rounds 20] [--nodes 2] [--settle 0]``. Starts a local cluster (2 nodes
x 2 GPUs) in a temporary directory with a second scheduler. Each round waits until ``scontrol ping`` shows
both schedulers UP (and ``--settle`` seconds more), kills the leader, submits a one-second job at once and
takes the time from the kill to that job's ``JobAllocated`` in the log (the standby's first decision); then it
starts the killed scheduler again (a standby now) and waits until it has rebuilt its state. Prints each
round's time, p50 and max, with the ``lease_ttl`` in force.
"""

from __future__ import annotations

import argparse
import getpass
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "e2e")]

from e2e_cli import Cli, user_env  # noqa: E402 (the helpers live with the tests)
from test_e2e_failover import HOST, SHORT, allocation, ping, wait  # noqa: E402

from corral.cli.local_cluster import LocalCluster  # noqa: E402


def main() -> int:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--settle", type=float, default=0.0, help="seconds to wait once both are up, before the kill"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-failover-"))
    cluster = LocalCluster(root / "state", getpass.getuser(), nodes=args.nodes, gpus_per_node=2)
    cluster.state_dir.mkdir(mode=0o700)
    config = cluster.prepare()
    cluster.start(ready_timeout=90)
    cli = Cli(env=user_env(cluster.state_dir), workdir=root)
    names = {HOST: "scheduler", "standby": cluster.spawn_scheduler("standby")}
    times: list[float] = []
    try:
        for round_ in range(args.rounds):
            wait(lambda: sum(" is UP" in line for line in ping(cli)) == 2, 60, "both schedulers up")
            time.sleep(args.settle)
            leader = ping(cli)[0].split(" at ")[1].split(" is ")[0]
            cluster.kill(names[leader])
            killed = time.time()
            job = cli.sbatch(SHORT)
            wait(lambda j=job: allocation(cluster, j) is not None, 30, f"job {job} allocated")  # type: ignore[misc]
            decided = allocation(cluster, job)
            assert decided is not None and decided.envelope is not None
            times.append(decided.envelope.meta.occurred_at - killed)
            print(f"round {round_ + 1}: {leader} killed, next decision after {times[-1]:.2f} s", flush=True)
            # Started again, and up once it rebuilt (its old beat may still look fresh for a moment).
            log = cluster.state_dir / "logs" / f"{names[leader]}.log"
            rebuilt = log.read_text().count("state rebuilt")
            cluster.revive(names[leader])
            wait(
                lambda log=log, n=rebuilt: log.read_text().count("state rebuilt") > n,  # type: ignore[misc]
                60,
                "the killed one rebuilt",
            )
    finally:
        cluster.stop()
    print(
        f"lease_ttl {config.scheduler.lease_ttl_s} s, {len(times)} failovers: "
        f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
