"""The synthetic busy cluster the scheduler benchmarks build: nodes, running jobs and a deep queue.

A cluster of N nodes x 8 GPUs in three partitions; running jobs (``JobSubmitted`` + ``JobAllocated``,
about 80% of the GPUs busy, single-node jobs of 1-8 GPUs and whole-node jobs of 2-64 nodes, time limits
10 min - 2 days) and pending jobs of the same kinds, all with deterministic ids and times. Used by
``backfill_pass.py`` and ``rebuild.py``.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from corral.schemas import events as ev
from corral.schemas.events import NodeAllocation

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
        f"default = {'true' if p.default else 'false'}\nmax_time = {p.max_time_s}\n\n"
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
