"""Benchmark: ``corral audit --user USER`` over a long log, the command as a user runs it.

Usage: ``python bench/audit_history.py [--jobs 100000] [--before DIR]``. Starts a local cluster (with
``--before``, a second one whose services and commands run the checkout in DIR), submits ``--jobs`` held jobs
from a concurrent API client (each one entry of the log, and the user's), then times ``corral audit --user``
(the newest 1,000 of the user's entries; the gateway reads the log for them) and ``corral audit JOB`` twice
each, the clusters in turn. Results are recorded in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from api_load import Load, run_load  # bench/ is this script's directory: on sys.path
from bench_clusters import add_before, clusters, trees_of
from mass_cancel import command_env

from corral.cli import cmdclient

BIN = Path(sys.executable).parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    add_before(parser)
    args = parser.parse_args()
    trees = trees_of(args)
    lines = [
        "| code | jobs in the log | command | wall s (runs) | exit | lines |",
        "|---|---|---|---|---|---|",
    ]
    with clusters(trees) as benches:
        for bench in benches:
            started = time.monotonic()
            result = run_load(
                bench.cluster.user_credentials,
                Load(jobs=args.jobs, clients=2, in_flight=8, batch=100, held=True),
            )
            assert not result.errors, result.errors[:3]
            print(
                f"{bench.name}: {args.jobs} jobs submitted in {time.monotonic() - started:.1f} s", flush=True
            )
        for argv in (["corral", "audit", "--user", benches[0].cluster.user], ["corral", "audit", "1"]):
            for bench in benches:
                walls, out = [], None
                for _ in range(2):
                    started = time.monotonic()
                    out = subprocess.run(
                        [str(BIN / argv[0]), *argv[1:]],
                        env=command_env(bench),
                        capture_output=True,
                        text=True,
                        check=False,
                    )
                    walls.append(time.monotonic() - started)
                assert out is not None
                shown = ", ".join(f"{w:.2f}" for w in walls)
                error = f" ({out.stderr.strip()[-80:]})" if out.returncode else ""
                command = " ".join(argv)
                lines.append(
                    f"| {bench.name} | {args.jobs:,} | `{command}` | {shown} | {out.returncode}{error} |"
                    f" {len(out.stdout.splitlines())} |"
                )
                print(lines[-1], flush=True)
        for bench in benches:
            cmdclient.stop_servers(cmdclient.runtime_dir(command_env(bench)))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
