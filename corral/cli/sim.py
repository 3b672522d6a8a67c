"""``corral sim``: replay a workload trace through the scheduler's core in virtual time.

    corral sim TRACE.swf --units 100 --policy easy --starts starts.csv
    corral sim jobs.csv --config cluster.toml --policy conservative
    corral sim log.jsonl --policy fifo [--config cluster.toml]     (what-if: a log from corral log export)
    corral sim jobs.csv --config cluster.toml --set priority_weight_age=1000 --set fairshare=classic

TRACE is a Standard Workload Format trace (``.swf``; a processor is one schedulable unit, so
``--units`` gives the machine's processors) or a CSV of GPU jobs (``.csv``; columns in
``corral.libs.sim.workload``) run on the nodes and partitions of ``--config``. Prints mean/p50/
p95/max wait, mean bounded slowdown (10 s), utilisation and makespan; ``--starts`` writes one
CSV row per job (id, submit, start, end, nodes). Any failure is one line on stderr, exit 1.

With ``--config`` the simulation plans with the configuration's whole policy, the scheduler service's
(priority weights, fair share and its billing, partition tiers, QOS and limits, blocks, preemption);
``--policy`` and ``--window`` override its backfill mode and window, and ``--set KEY=VALUE`` any key of
its ``[scheduler]`` table (the value in TOML syntax, or a bare word as a string), validated as the file is.
Without ``--config``: the default policy (FIFO priority), EASY unless ``--policy``, an unbounded window.

A Corral event log (``.jsonl`` from ``corral log export``; ``corral.libs.sim.eventlog``) is a what-if:
its jobs are replayed with their real submit times, requests and run times on the cluster of
``--config`` (or the nodes the log registered), and the report has two columns, the simulated policy
and what really happened in the log.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from corral.cli.errors import CliError, run_command
from corral.libs.config.cluster import ConfigError, load_config
from corral.libs.core.policy import Backfill
from corral.libs.sim.engine import SimCluster, SimError, SimResult, config_cluster, simulate, unit_cluster
from corral.libs.sim.eventlog import log_cluster, log_workload, looks_like_log, parse_log
from corral.libs.sim.report import format_comparison, format_metrics, metrics, write_starts
from corral.libs.sim.workload import SimJob, WorkloadError, parse_workload

COMMAND = "corral sim"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Replay a workload (SWF trace or GPU-job CSV) in virtual time."
    )
    parser.add_argument(
        "trace", help="an SWF trace (.swf), a CSV of GPU jobs (.csv) or a Corral event log (.jsonl)"
    )
    parser.add_argument("--units", type=int, help="a cluster of N identical units (SWF processors)")
    parser.add_argument("--config", help="cluster.toml whose nodes, partitions and policy to simulate")
    parser.add_argument(
        "--policy",
        choices=("fifo", "easy", "conservative"),
        help="backfill mode (default: the config's, else easy)",
    )
    parser.add_argument(
        "--window",
        type=int,
        metavar="SECONDS",
        help="plan reservations this far ahead (default: the config's backfill_window, else unbounded)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a [scheduler] key of --config (e.g. priority_weight_age=1000); repeatable",
    )
    parser.add_argument("--starts", help="write id,submit,start,end,nodes of every job to this CSV")
    parser.add_argument("--limit", type=int, help="simulate only the first N jobs (by submit time)")
    return parser


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"{path}: cannot read the trace: {exc.strerror}") from None


def _workload(path: str, data: bytes, limit: int | None) -> list[SimJob]:
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a text file") from None
    try:
        jobs = parse_workload(text, source=path)
    except WorkloadError as exc:
        raise CliError(str(exc)) from None
    if not jobs:
        raise CliError(f"{path}: no jobs in the trace")
    return jobs[:limit] if limit is not None else jobs


def _overrides(settings: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` as [scheduler] keys: the value in TOML syntax, else the bare word as a string."""
    out: dict[str, Any] = {}
    for setting in settings:
        key, sep, text = setting.partition("=")
        key = key.strip().removeprefix("scheduler.")
        if not sep or not key or not text.strip():
            raise CliError(f"--set: expected KEY=VALUE with a [scheduler] key, got {setting!r}")
        try:
            out[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = text.strip()
    return out


def _cluster(args: argparse.Namespace) -> SimCluster:
    if (args.units is None) == (args.config is None):
        raise CliError("give either --units N (identical units) or --config cluster.toml")
    if args.config is None:
        return unit_cluster(args.units)
    try:
        return config_cluster(load_config(Path(args.config), _overrides(args.set)))
    except ConfigError as exc:
        raise CliError(str(exc)) from None


def _run(jobs: list[SimJob], cluster: SimCluster, args: argparse.Namespace) -> tuple[Backfill, SimResult]:
    """Simulate with the cluster's policy, ``--policy`` and ``--window`` overriding its backfill."""
    base = cluster.policy
    backfill: Backfill = args.policy or (base.backfill if base is not None else "easy")
    window = args.window if args.window is not None else base.backfill_window_s if base is not None else None
    try:
        return backfill, simulate(jobs, cluster, backfill, window)
    except SimError as exc:
        raise CliError(str(exc)) from None


def _sim(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1")
    if args.window is not None and args.window < 1:
        raise CliError("--window must be at least 1 second")
    if args.set and args.config is None:
        raise CliError("--set overrides keys of --config cluster.toml: give --config")
    data = _read(args.trace)
    if looks_like_log(data[:256], args.trace):
        result = _what_if(args, data)
    else:
        jobs = _workload(args.trace, data, args.limit)
        _, result = _run(jobs, _cluster(args), args)
        print(format_metrics(metrics(result)))
    _write_starts(args, result)
    return 0


def _what_if(args: argparse.Namespace, data: bytes) -> SimResult:
    """Replay an exported event log with the policy; print it beside what really happened."""
    if args.units is not None:
        raise CliError("--units is for SWF traces: a log is replayed on --config or on its own nodes")
    try:
        workload = log_workload(parse_log(data, args.trace))
    except WorkloadError as exc:
        raise CliError(str(exc)) from None
    jobs, actual = list(workload.jobs), list(workload.actual)
    if args.limit is not None:
        jobs, actual = jobs[: args.limit], actual[: args.limit]
    if not jobs:
        raise CliError(f"{args.trace}: no job of the log ran to its end: nothing to replay")
    if args.config is None and not workload.nodes:
        raise CliError(f"{args.trace}: the log registered no node: give --config cluster.toml")
    if workload.skipped:
        print(
            f"{COMMAND}: note: {workload.skipped} jobs of the log never ran or had not ended: not replayed",
            file=sys.stderr,
        )
    cluster = _cluster(args) if args.config is not None else log_cluster(workload.nodes)
    backfill, result = _run(jobs, cluster, args)
    real = log_cluster(workload.nodes).capacity if workload.nodes else cluster.capacity
    happened = SimResult(tuple(actual), real, 0)
    print(format_comparison([(backfill, metrics(result)), ("actual", metrics(happened))]))
    return result


def _write_starts(args: argparse.Namespace, result: SimResult) -> None:
    if args.starts is not None:
        try:
            with open(args.starts, "w", encoding="utf-8", newline="") as out:
                write_starts(result.records, out)
        except OSError as exc:
            raise CliError(f"{args.starts}: cannot write: {exc.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``corral sim``."""
    return run_command(COMMAND, _sim, argv)
