"""Soak: a long chaos run on ``corral up --ha``, its figures for ``bench/RESULTS.md``.

Usage: ``python bench/chaos_soak.py [--jobs 300] [--rounds 4] [--spacing 3]``. Starts ``corral up --ha`` (2
nodes x 2 GPUs) in a temporary directory and submits ``--jobs`` short jobs (a quarter on two nodes, most
with GPUs) while killing, ``--rounds`` times over, each process of ``tests/e2e/chaos.py``'s ``TARGETS`` in
turn, ``--spacing`` seconds apart. Then waits for every job and checks the harness's invariants. Prints:
jobs accepted / completed / lost / duplicated, GPU conflicts, requeues, the time each killed process took
to run again (p50 / max by process), and the sbatch calls refused during the kills.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests" / "e2e")]

from chaos import TARGETS, Chaos  # noqa: E402 (the harness lives with the tests)
from e2e_cli import Cli, user_env  # noqa: E402
from test_e2e_supervision import Up  # noqa: E402


def main() -> int:
    """Run the soak and print its figures."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4, help="times each target is killed")
    parser.add_argument("--spacing", type=float, default=3.0, help="seconds between two kills")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="corral-soak-"))
    state, out = root / "state", root / "out"
    out.mkdir()
    env = user_env(state, commands_on_path=True)
    cli = Cli(env=env, workdir=root)
    up = Up(state, env, "--ha")
    try:
        up.wait_line("is up")
        chaos = Chaos(up, cli, out)
        targets = TARGETS * args.rounds
        figures = chaos.run(args.jobs, targets, args.spacing)
        states = chaos.wait_ended(timeout=600)
        problems = chaos.check()
        failovers = chaos.failovers()
    finally:
        up.stop()
    accepted = figures.accepted
    completed = sum(1 for s in states.values() if s == "COMPLETED")
    lost = len(set(accepted) - set(states))
    duplicated = len(accepted) - len(set(accepted))
    gpu_conflicts = sum(1 for p in problems if p.startswith("GPU "))
    requeued = sum(1 for p in problems if "attempts" in p)
    print(f"jobs accepted {len(accepted)}, completed {completed}, lost {lost}, duplicated {duplicated}")
    print(f"GPU conflicts {gpu_conflicts}, jobs requeued {requeued}, other problems {len(problems)}")
    back: dict[str, list[float]] = defaultdict(list)
    refused: dict[str, int] = defaultdict(int)
    for i, (name, seconds) in enumerate(figures.kills):
        back[name].append(seconds)
        refused[name] += figures.refused_in(i)
    print("| process | kills | back after p50 (s) | max (s) | sbatch refused in its windows |")
    print("|---|---|---|---|---|")
    for name, times in back.items():
        print(
            f"| {name} | {len(times)} | {statistics.median(times):.2f} | {max(times):.2f} | {refused[name]} |"
        )
    print(f"sbatch calls refused (and retried): {len(figures.refused)}")
    if failovers:
        print(
            f"failovers {len(failovers)} (leader killed or paused -> a scheduler took the lease): "
            f"p50 {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s"
        )
    for problem in problems[:20]:
        print(f"  problem: {problem}")
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
