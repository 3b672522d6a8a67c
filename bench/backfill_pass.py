"""Benchmark: one scheduling pass (``plan()``) on a large, busy cluster with a deep queue.

    python bench/backfill_pass.py [--small] [--budget 300] [--profile-budget 120]

Builds the log of a cluster of 10,000 nodes x 8 GPUs in three partitions (``--small``: 1,000 nodes):
node registrations, running jobs (``JobSubmitted`` + ``JobAllocated``, about 80% of the GPUs busy,
single-node jobs of 1-8 GPUs and whole-node jobs of 2-64 nodes, time limits 10 min - 2 days) and
100,000 pending jobs (``--small``: 10,000) of the same kinds, all with deterministic ids and times.
Then it times the fold of that log and one ``plan()`` call per backfill policy (EASY, the default,
then conservative and FIFO), profiles the EASY pass (cProfile, top functions by cumulative and own
time) and prints Markdown tables with the machine.

Issue target: one full-depth backfill pass on 10,000 nodes x 8 GPUs with 100,000 pending jobs <= 1 s.

A pass that would run longer than ``--budget`` seconds is stopped (SIGALRM) and its full time is
extrapolated from the share of the queue it got through (a lower bound when later jobs cost more,
as they do for conservative backfill, whose reservations pile up). ``rebuild.py`` reuses the
cluster and job builders of this module.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import dataclasses
import gc
import io
import math
import os
import platform
import pstats
import random
import resource
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType

import msgspec

from corral.libs.config import parse_config
from corral.libs.core import plan as plan_module
from corral.libs.core.backfill import Planner
from corral.libs.core.fold import fold
from corral.libs.core.placement import Request
from corral.libs.core.plan import Backfill, Plan, Policy
from corral.libs.core.state import State
from corral.schemas import events as ev
from corral.schemas.events import NodeAllocation
from corral.services.scheduler.views import policy_of

GPUS_PER_NODE = 8
CPUS_PER_NODE = 128
CPUS_PER_GPU = CPUS_PER_NODE // GPUS_PER_NODE
MEM_PER_NODE_MB = 2 * 1024 * 1024
NOW = 1_800_000_000.0  # the log's clock at the pass (fixed: every run builds the same log)
DAY = 86400
MIN_LIMIT_S, MAX_LIMIT_S = 600, 2 * DAY
DEBUG_MAX_S = 4 * 3600
USERS = 300

# Single-node sizes (GPUs) and multi-node sizes (whole nodes), with weights.
SINGLE_GPUS = ((1, 2, 4, 8), (0.35, 0.20, 0.20, 0.25))
MULTI_NODES = ((2, 4, 8, 16, 32, 64), (0.35, 0.25, 0.20, 0.10, 0.06, 0.04))
# Busy GPUs on a node that runs single-node jobs (mean 5.55 of 8; with ~40% of the nodes in
# multi-node runs about 81% of all GPUs are busy).
BUSY_GPUS = ((0, 1, 2, 3, 4, 5, 6, 7, 8), (0.05, 0.03, 0.07, 0.05, 0.12, 0.08, 0.15, 0.15, 0.30))
POLICIES: tuple[Backfill, ...] = ("easy", "conservative", "fifo")
MULTI_START = 0.0577  # chance that a node starts a multi-node run (mean run 10.9 nodes)


@dataclass(frozen=True)
class Part:
    """One partition of the benchmark cluster: nodes ``[first, last)``."""

    name: str  # partition name
    first: int  # first node index
    last: int  # one past the last node index
    default: bool  # the default partition
    max_time_s: int  # MaxTime
    share: float  # share of the pending jobs submitted to it


def layout(n_nodes: int) -> list[Part]:
    """Three partitions; ``batch`` and ``large`` overlap by 5% of the nodes."""
    return [
        Part("batch", 0, int(n_nodes * 0.60), True, MAX_LIMIT_S, 0.65),
        Part("large", int(n_nodes * 0.55), int(n_nodes * 0.95), False, MAX_LIMIT_S, 0.30),
        Part("debug", int(n_nodes * 0.95), n_nodes, False, DEBUG_MAX_S, 0.05),
    ]


def node_name(i: int) -> str:
    """Name of node ``i``."""
    return f"n{i:05d}"


def hostlist_of(first: int, last: int) -> str:
    """Hostlist of nodes ``[first, last)``."""
    return f"n[{first:05d}-{last - 1:05d}]"


def config_text(n_nodes: int) -> str:
    """The cluster configuration (TOML) of the benchmark cluster."""
    parts = "".join(
        f'[[partitions]]\nname = "{p.name}"\nnodes = "{hostlist_of(p.first, p.last)}"\n'
        f"default = {'true' if p.default else 'false'}\nmax_time = {p.max_time_s // 60}\n\n"
        for p in layout(n_nodes)
    )
    return (
        '[cluster]\nname = "bench"\n\n'
        f'[[nodes]]\nnames = "{hostlist_of(0, n_nodes)}"\ncpus = {CPUS_PER_NODE}\n'
        f'memory = "{MEM_PER_NODE_MB}M"\ngpus = {GPUS_PER_NODE}\ngpu_type = "h100"\n\n{parts}'
    )


def node_registrations(n_nodes: int) -> list[ev.NodeRegistered]:
    """One registration per node, with the partitions of the layout."""
    parts = layout(n_nodes)
    return [
        ev.NodeRegistered(
            node=node_name(i),
            cpus=CPUS_PER_NODE,
            mem_mb=MEM_PER_NODE_MB,
            gpus=GPUS_PER_NODE,
            gpu_type="h100",
            partitions=[p.name for p in parts if p.first <= i < p.last],
            features=["nvlink"],
            boot_id=f"{i:032x}",
        )
        for i in range(n_nodes)
    ]


def user_environment(user: str) -> dict[str, str]:
    """A submitter's exported environment (sbatch's default --export=ALL), ~700 bytes."""
    return {
        "HOME": f"/home/{user}",
        "USER": user,
        "LOGNAME": user,
        "SHELL": "/bin/bash",
        "LANG": "en_US.UTF-8",
        "TERM": "xterm-256color",
        "PATH": f"/home/{user}/.conda/envs/torch/bin:/opt/conda/bin:/usr/local/cuda/bin:/usr/bin:/bin",
        "LD_LIBRARY_PATH": "/usr/local/cuda/lib64:/usr/local/nccl/lib",
        "CUDA_HOME": "/usr/local/cuda",
        "CONDA_PREFIX": f"/home/{user}/.conda/envs/torch",
        "PYTHONPATH": f"/home/{user}/src/trainer",
        "MODULEPATH": "/etc/modulefiles:/usr/share/modulefiles",
        "OMP_NUM_THREADS": "16",
        "WANDB_PROJECT": f"{user}-llm",
        "HF_HOME": f"/scratch/{user}/hf",
        "HOSTNAME": "login01",
    }


def job_spec(
    number: int,
    user: str,
    partition: str | None,
    nodes: int,
    gpus: int,
    limit_s: int,
    mem_mb: int | None,
    environment: dict[str, str],
) -> ev.JobSpec:
    """A training job's spec: one task per GPU with 16 CPUs each, a ~350-byte script."""
    script = (
        "#!/bin/bash\n"
        f"#SBATCH -J train-{number}\n"
        f"#SBATCH -N {nodes} --gres=gpu:{gpus} -t {limit_s // 60}\n"
        f"#SBATCH -o /scratch/{user}/logs/%x-%j.out\n"
        "source /opt/conda/etc/profile.d/conda.sh\nconda activate torch\n"
        "export NCCL_DEBUG=WARN NCCL_IB_HCA=mlx5\n"
        f"srun python -m trainer.main --config configs/run{number % 97}.yaml --seed {number}\n"
    )
    return ev.JobSpec(
        name=f"train-{number}",
        script=script,
        workdir=f"/home/{user}/src/trainer",
        environment=environment,
        partition=partition,
        nodes=nodes,
        ntasks=nodes * max(gpus, 1),
        ntasks_per_node=max(gpus, 1),
        cpus_per_task=CPUS_PER_GPU,
        mem_per_node_mb=mem_mb,
        gpus_per_node=gpus,
        time_limit_s=limit_s,
        submit_host="login01",
    )


def time_limit(rng: random.Random, part: Part) -> int:
    """Log-uniform between 10 minutes and the partition's MaxTime, whole minutes."""
    limit = math.exp(rng.uniform(math.log(MIN_LIMIT_S), math.log(min(MAX_LIMIT_S, part.max_time_s))))
    return int(limit) // 60 * 60


def pending_job(rng: random.Random, number: int, parts: list[Part]) -> tuple[str, ev.JobSpec]:
    """(user, spec) of one pending job: 90% single-node 1-8 GPUs, 10% 2-64 whole nodes."""
    part = rng.choices(parts, weights=[p.share for p in parts])[0]
    user = f"u{rng.randrange(USERS):03d}"
    if part.name != "debug" and rng.random() < 0.10:
        nodes, gpus = rng.choices(*MULTI_NODES)[0], GPUS_PER_NODE
    else:
        nodes, gpus = 1, rng.choices(*SINGLE_GPUS)[0]
    mem = gpus * 200 * 1024 if rng.random() < 0.10 else None
    spec = job_spec(
        number,
        user,
        None if part.default else part.name,
        nodes,
        gpus,
        time_limit(rng, part),
        mem,
        user_environment(user),
    )
    return user, spec


@dataclass
class Run:
    """A running job of the benchmark log."""

    user: str  # owner
    spec: ev.JobSpec  # as submitted
    partition: str  # where it runs
    allocations: list[NodeAllocation]  # what it holds
    start: float  # when it started
    submit: float  # when it was submitted


def running_jobs(rng: random.Random, n_nodes: int) -> list[Run]:
    """Runs that keep about 80% of the GPUs busy, each on nodes of one partition."""
    parts = layout(n_nodes)
    # Each node runs jobs of the first partition it belongs to.
    homes = [dataclasses.replace(p, first=parts[i - 1].last if i else 0) for i, p in enumerate(parts)]
    runs: list[Run] = []
    for part in homes:
        i = part.first
        while i < part.last:
            if rng.random() < MULTI_START:
                count = min(rng.choices(*MULTI_NODES)[0], part.last - i)
                if count >= 2:
                    runs.append(
                        _run(rng, part, [(node_name(j), 0, GPUS_PER_NODE) for j in range(i, i + count)])
                    )
                    i += count
                    continue
            busy = rng.choices(*BUSY_GPUS)[0]
            used = 0
            for size in (8, 4, 2, 1):  # binary decomposition: 7 GPUs = jobs of 4 + 2 + 1
                if busy & size:
                    runs.append(_run(rng, part, [(node_name(i), used, size)]))
                    used += size
            i += 1
    return runs


def _run(rng: random.Random, part: Part, nodes: list[tuple[str, int, int]]) -> Run:
    """A run on ``nodes`` = [(node, first GPU index, GPUs)], started within its time limit."""
    limit = time_limit(rng, part)
    start = NOW - rng.uniform(0.0, 0.95 * limit)
    user = f"u{rng.randrange(USERS):03d}"
    gpus = nodes[0][2]
    mem = gpus * 200 * 1024 if rng.random() < 0.10 else None
    partition = None if part.default else part.name
    spec = job_spec(0, user, partition, len(nodes), gpus, limit, mem, user_environment(user))
    allocations = [
        NodeAllocation(
            node=name, gpus=list(range(first, first + count)), cpus=count * CPUS_PER_GPU, mem_mb=mem or 0
        )
        for name, first, count in nodes
    ]
    return Run(user, spec, part.name, allocations, start, start - rng.uniform(0.0, 7200.0))


def meta(seq: int, at: float, actor: str) -> ev.Meta:
    """Deterministic envelope metadata."""
    return ev.Meta(event_id=f"{seq:032x}", occurred_at=at, actor=actor)


def build_log(n_nodes: int, n_pending: int, seed: int = 1) -> tuple[list[tuple[int, ev.Envelope]], int]:
    """The whole log in time order, and the number of running jobs in it."""
    rng = random.Random(seed)
    parts = layout(n_nodes)
    runs = running_jobs(rng, n_nodes)
    # (submit time, tie-break, user, spec, run or None); job ids follow submit order.
    jobs: list[tuple[float, int, str, ev.JobSpec, Run | None]] = [
        (run.submit, k, run.user, run.spec, run) for k, run in enumerate(runs)
    ]
    for k in range(n_pending):
        user, spec = pending_job(rng, k, parts)
        jobs.append((NOW - rng.uniform(0.0, DAY), len(runs) + k, user, spec, None))
    jobs.sort(key=lambda j: (j[0], j[1]))
    timed: list[tuple[float, int, ev.Event, str]] = [
        (NOW - 3 * DAY, i, body, "agent") for i, body in enumerate(node_registrations(n_nodes))
    ]
    for job_id, (submit, _, user, spec, run) in enumerate(jobs, start=1):
        timed.append((submit, len(timed), ev.JobSubmitted(job_id=job_id, user=user, spec=spec), user))
        if run is not None:
            alloc = ev.JobAllocated(
                job_id=job_id,
                attempt=0,
                partition=run.partition,
                allocations=run.allocations,
                time_limit_s=spec.time_limit_s,
            )
            timed.append((run.start, len(timed), alloc, "corral-scheduler"))
    timed.sort(key=lambda t: (t[0], t[1]))
    log = [
        (seq, ev.Envelope(meta=meta(seq, at, actor), body=body))
        for seq, (at, _, body, actor) in enumerate(timed, start=1)
    ]
    return log, len(runs)


class OutOfTime(Exception):
    """The step ran past its budget."""


@contextlib.contextmanager
def budget(seconds: float) -> Iterator[None]:
    """Raise OutOfTime in this (main) thread after ``seconds``."""

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise OutOfTime

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class CountingPlanner(Planner):
    """The core's planner, counting the jobs it was asked about (progress of a pass that is stopped)."""

    considered = 0
    reservations = 0

    def start_now(self, partition: str, req: Request, limit: float) -> list[NodeAllocation] | None:
        CountingPlanner.considered += 1
        return super().start_now(partition, req, limit)

    def reserve(self, partition: str, req: Request, limit: float, window: float) -> float | None:
        CountingPlanner.reservations += 1
        return super().reserve(partition, req, limit, window)


@dataclass
class PassResult:
    """One timed ``plan()`` call."""

    policy: str  # backfill policy
    wall: float  # seconds (or seconds until stopped)
    finished: bool  # False: stopped at the budget
    considered: int  # jobs planned (start_now calls)
    reservations: int  # reserve calls
    plan: Plan | None  # the result when finished


def timed_pass(
    state: State, policy: Policy, budget_s: float, profiler: cProfile.Profile | None = None
) -> PassResult:
    """Time one plan() call, stopping it after ``budget_s``."""
    CountingPlanner.considered = CountingPlanner.reservations = 0
    result: Plan | None = None
    started = time.perf_counter()
    try:
        with budget(budget_s):
            if profiler is not None:
                profiler.enable()
            try:
                result = plan_module.plan(state, NOW, policy)
            finally:
                if profiler is not None:
                    profiler.disable()
    except OutOfTime:
        pass
    wall = time.perf_counter() - started
    return PassResult(
        policy.backfill,
        wall,
        result is not None,
        CountingPlanner.considered,
        CountingPlanner.reservations,
        result,
    )


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    """One line describing the machine."""
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    system = f"{platform.system()} {platform.release()} {platform.machine()}"
    return (
        f"nproc {len(os.sched_getaffinity(0))}, {mem_gib:.0f} GiB RAM, {system}, "
        f"Python {platform.python_version()}, msgspec {msgspec.__version__}"
    )


def row(step: str, wall: str, rate: str, notes: str, rss: float | None = None) -> str:
    """A Markdown table row with ``rss`` (negative: not measured), else this process's peak RSS so far."""
    peak = "-" if rss is not None and rss < 0 else f"{peak_rss_mib() if rss is None else rss:,.0f}"
    return f"| {step} | {wall} | {rate} | {peak} | {notes} |"


def profile_text(profiler: cProfile.Profile, sort: str, top: int) -> str:
    """The ``top`` functions of a profile by ``sort``, as pstats prints them (header trimmed)."""
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(sort).print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(line.rstrip() for line in lines[start:] if line.strip())


def pass_row(res: PassResult, pending: int) -> str:
    """A table row for one plan() call."""
    if res.finished and res.plan is not None:
        started = sum(isinstance(d, ev.JobAllocated) for d in res.plan.decisions)
        note = f"{started:,} jobs started now, {len(res.plan.starts):,} reservations"
        return row(f"plan {res.policy}", f"{res.wall:.2f}", f"{pending / res.wall:,.0f} jobs/s", note)
    done = max(res.considered, 1)
    note = (
        f"stopped at the budget after {res.considered:,} of {pending:,} jobs"
        f" ({res.reservations:,} reservations); extrapolated full pass >= {res.wall * pending / done:,.0f} s"
    )
    return row(f"plan {res.policy}", f"> {res.wall:.0f}", f"{done / res.wall:,.0f} jobs/s", note)


def main() -> int:
    """Build the cluster, fold it, time the passes and print the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="1,000 nodes and 10,000 pending jobs")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds before a pass is stopped")
    parser.add_argument("--profile-budget", type=float, default=120.0, help="seconds of EASY pass to profile")
    args = parser.parse_args()
    n_nodes, n_pending = (1_000, 10_000) if args.small else (10_000, 100_000)
    # The planner of plan() is the core's, with counters (plan.py imports the class by name).
    plan_module.Planner = CountingPlanner  # type: ignore[attr-defined]

    rows = ["| step | wall s | rate | peak RSS MiB | notes |", "|---|---|---|---|---|"]
    started = time.perf_counter()
    log, n_running = build_log(n_nodes, n_pending)
    wall = time.perf_counter() - started
    note = f"{len(log):,} envelopes: {n_nodes:,} nodes, {n_running:,} running + {n_pending:,} pending jobs"
    rows.append(row("build log", f"{wall:.2f}", f"{len(log) / wall:,.0f} events/s", note))

    started = time.perf_counter()
    state = fold(log)
    wall = time.perf_counter() - started
    total = sum(n.gpus for n in state.nodes.values())
    busy = sum(len(n.used_gpus) for n in state.nodes.values())
    running = sum(j.state == "RUNNING" for j in state.jobs.values())
    assert running == n_running, f"{n_running - running} running jobs were refused by the fold"
    note = f"{busy:,} of {total:,} GPUs busy ({busy / total:.1%})"
    rows.append(row("fold", f"{wall:.2f}", f"{len(log) / wall:,.0f} events/s", note))
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        fold(log)
        wall = time.perf_counter() - started
    finally:
        gc.enable()
    note = "same log, cyclic GC off during the fold"
    rows.append(row("fold, gc disabled", f"{wall:.2f}", f"{len(log) / wall:,.0f} events/s", note))
    gc.collect()

    policy = policy_of(parse_config(config_text(n_nodes)))
    results = {}
    for name in POLICIES:
        results[name] = timed_pass(state, dataclasses.replace(policy, backfill=name), args.budget)
        rows.append(pass_row(results[name], n_pending))
        print(rows[-1], file=sys.stderr, flush=True)

    profiler = cProfile.Profile()
    profiled = timed_pass(state, policy, args.profile_budget, profiler)
    scope = (
        "the whole pass" if profiled.finished else f"the first {profiled.considered:,} of {n_pending:,} jobs"
    )

    easy = results["easy"]
    verdict = "met" if easy.finished and easy.wall <= 1.0 else "not met"
    print(f"## backfill_pass: {n_nodes:,} nodes x {GPUS_PER_NODE} GPUs, {n_pending:,} pending jobs\n")
    print(f"Machine: {machine()}\n")
    print("\n".join(rows))
    print(
        f"\nTarget (EASY pass <= 1 s, 10,000 nodes / 100,000 pending): {verdict} ({easy.wall:.2f} s here).\n"
    )
    print(
        f"cProfile of the EASY pass ({scope}, {profiled.wall:.1f} s under the profiler), top 10 cumulative:\n"
    )
    print("```\n" + profile_text(profiler, "cumulative", 10) + "\n```\n")
    print("Top 10 by own time:\n")
    print("```\n" + profile_text(profiler, "tottime", 10) + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
