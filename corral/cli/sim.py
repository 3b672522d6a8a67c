"""``corral sim``: replay a workload trace through the scheduler's core in virtual time.

    corral sim TRACE.swf --units 100 --policy easy --starts starts.csv
    corral sim jobs.csv --config cluster.toml --policy conservative

TRACE is a Standard Workload Format trace (``.swf``; a processor is one schedulable unit, so
``--units`` gives the machine's processors) or a CSV of GPU jobs (``.csv``; columns in
``corral.libs.sim.workload``) run on the nodes and partitions of ``--config``. Prints mean/p50/
p95/max wait, mean bounded slowdown (10 s), utilisation and makespan; ``--starts`` writes one
CSV row per job (id, submit, start, end, nodes). Any failure is one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from corral.cli.errors import CliError, run_command
from corral.libs.config import ConfigError, load_config
from corral.libs.sim.engine import SimCluster, SimError, config_cluster, simulate, unit_cluster
from corral.libs.sim.report import format_metrics, metrics, write_starts
from corral.libs.sim.workload import SimJob, WorkloadError, parse_workload

COMMAND = "corral sim"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Replay a workload (SWF trace or GPU-job CSV) in virtual time."
    )
    parser.add_argument("trace", help="an SWF trace (.swf) or a CSV of GPU jobs (.csv)")
    parser.add_argument("--units", type=int, help="a cluster of N identical units (SWF processors)")
    parser.add_argument("--config", help="cluster.toml whose nodes and partitions to simulate")
    parser.add_argument("--policy", choices=("fifo", "easy", "conservative"), default="easy")
    parser.add_argument(
        "--window", type=int, metavar="SECONDS", help="plan reservations this far ahead (default: unbounded)"
    )
    parser.add_argument("--starts", help="write id,submit,start,end,nodes of every job to this CSV")
    parser.add_argument("--limit", type=int, help="simulate only the first N jobs (by submit time)")
    return parser


def _workload(path: str, limit: int | None) -> list[SimJob]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CliError(f"{path}: cannot read the trace: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text file") from None
    try:
        jobs = parse_workload(text, source=path)
    except WorkloadError as exc:
        raise CliError(str(exc)) from None
    if not jobs:
        raise CliError(f"{path}: no jobs in the trace")
    return jobs[:limit] if limit is not None else jobs


def _cluster(args: argparse.Namespace) -> SimCluster:
    if (args.units is None) == (args.config is None):
        raise CliError("give either --units N (identical units) or --config cluster.toml")
    if args.config is None:
        return unit_cluster(args.units)
    try:
        return config_cluster(load_config(Path(args.config)))
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def _sim(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1")
    if args.window is not None and args.window < 1:
        raise CliError("--window must be at least 1 second")
    jobs = _workload(args.trace, args.limit)
    try:
        cluster = _cluster(args)
        result = simulate(jobs, cluster, args.policy, args.window)
    except SimError as exc:
        raise CliError(str(exc)) from None
    print(format_metrics(metrics(result)))
    if args.starts is not None:
        try:
            with open(args.starts, "w", encoding="utf-8", newline="") as out:
                write_starts(result.records, out)
        except OSError as exc:
            raise CliError(f"{args.starts}: cannot write: {exc.strerror}") from None
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``corral sim``."""
    return run_command(COMMAND, _sim, argv)
