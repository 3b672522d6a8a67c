"""Benchmark: ``squeue`` of a user with big job arrays, the command as a user runs it.

Usage: ``python bench/squeue_arrays.py [--arrays 50] [--runs 5] [--before DIR]``. Starts a local cluster
(with ``--before``, a second one whose services and commands run the checkout in DIR, measured in turn),
submits ``--arrays`` arrays of 1,001 held tasks from an API client, waits until squeue shows them all, then
runs ``squeue -u USER`` (one ``A_[0-1000]`` line an array) and ``squeue -r -u USER`` (a line a task)
``--runs`` times each, alternating the clusters: the median wall seconds of the command, the lines it
printed, and the scheduler's CPU seconds for the runs (every scheduler answers every query). Before, the
scheduler sent every task and squeue merged them; it sends an array's alike pending tasks as one row now
(``services/scheduler/array_rows.py``). Results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from bench_clusters import BenchCluster, add_before, clusters, trees_of  # bench/ is on sys.path
from mass_cancel import BIN, command_env, submit_arrays, wait_live

from corral.cli import cmdclient


def squeue(bench: BenchCluster, *argv: str) -> tuple[float, int]:
    """One ``squeue`` of the cluster's user: its wall seconds and the lines it printed."""
    started = time.monotonic()
    out = subprocess.run(
        [str(BIN / "squeue"), "-h", "-u", bench.cluster.user, *argv],
        env=command_env(bench),
        capture_output=True,
        text=True,
        check=True,
    )
    return time.monotonic() - started, len(out.stdout.splitlines())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrays", type=int, default=50, help="arrays of 1,001 held tasks")
    parser.add_argument("--runs", type=int, default=5, help="runs of each command on each cluster")
    add_before(parser)
    args = parser.parse_args()
    trees = trees_of(args)
    commands = {"squeue": (), "squeue -r": ("-r",)}
    walls: dict[tuple[str, str], list[float]] = {}
    lines: dict[tuple[str, str], int] = {}
    cpu: dict[tuple[str, str], float] = {}
    with clusters(trees) as benches:
        for bench in benches:
            submit_arrays(bench, args.arrays)
            wait_live(bench, False, args.arrays * 1001)
        for r in range(args.runs):
            for bench in benches if r % 2 == 0 else list(reversed(benches)):
                for command, argv in commands.items():
                    key = (bench.name, command)
                    before = bench.cpu().get("scheduler", 0.0)
                    took, lines[key] = squeue(bench, *argv)
                    cpu[key] = cpu.get(key, 0.0) + bench.cpu().get("scheduler", 0.0) - before
                    walls.setdefault(key, []).append(took)
        for bench in benches:
            cmdclient.stop_servers(cmdclient.runtime_dir(command_env(bench)))
    print(f"{args.arrays} arrays x 1,001 held tasks, {args.runs} runs of each command")
    print("| code | command | lines | wall s, median (min-max) | scheduler CPU s a run |")
    print("|---|---|---|---|---|")
    for (name, command), took in walls.items():
        print(
            f"| {name} | `{command}` | {lines[(name, command)]:,} | {statistics.median(took):.2f}"
            f" ({min(took):.2f}-{max(took):.2f}) | {cpu[(name, command)] / args.runs:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
