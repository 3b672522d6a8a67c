"""The batch job's environment and output paths (pure): what SLURM_CONTRACT.md promises scripts, in Slurm
22.05's forms, set where Slurm sets them (``docs/slurm-compatibility.md``, "Job environment"): its task
counts only with one (``JobSpec.ntasks_set``), every GPU runtime's ordinals, and what the node adds
(``NodeEnv``: the run's TMPDIR, SLURM_CONF, the topology address)."""

from __future__ import annotations

import os.path
from collections.abc import Mapping
from dataclasses import dataclass

from corral.libs.slurm import hostlist
from corral.libs.slurm.array import array_indices, index_step
from corral.libs.trace.spans import parse_traceparent, span_id_for
from corral.schemas.api import LaunchOrder

#: Slurm's value of %a / SLURM_ARRAY_TASK_ID-less jobs in file patterns (NO_VAL - 1).
NO_ARRAY_INDEX = "4294967294"
#: Default output file of a job, and of an array task.
DEFAULT_OUTPUT = "slurm-%j.out"
DEFAULT_ARRAY_OUTPUT = "slurm-%A_%a.out"


#: The agent's own variables a job gets: where the cluster is, so the commands inside a job find it (never
#: the agent's credentials).
AGENT_VARIABLES = ("CORRAL_STATE_DIR", "CORRAL_NATS_URL")
#: PATH of a job whose exported environment has none (``--export=NONE``), as a login shell's default.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: Every GPU runtime's variable of the visible GPUs (CUDA, OpenCL, ROCm, oneAPI), all with the same indices:
#: Slurm's gres/gpu plugin sets each of them (gres.conf's default env flags).
GPU_ORDINALS = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")
#: TMPDIR of a job that has no private one (slurmstepd's default).
SHARED_TMPDIR = "/tmp"


@dataclass(frozen=True)
class NodeEnv:
    """What the node a job runs on adds to its environment (slurmd's and slurmstepd's per-node variables)."""

    tmpdir: str | None = None  # TMPDIR: the run's private directory here (None: the job's own, else /tmp)
    conf: str | None = None  # SLURM_CONF: the cluster configuration file the agent read (None: not set)
    topology: tuple[str, str] | None = None  # SLURM_TOPOLOGY_ADDR, _PATTERN (None: the node's name, "node")


def topology_address(node: str, blocks: Mapping[str, str]) -> tuple[str, str]:
    """SLURM_TOPOLOGY_ADDR and SLURM_TOPOLOGY_ADDR_PATTERN of ``node`` (topology/tree's form): its block (a
    switch) then its name, ``nvl1.gpu01`` and ``switch.node``; without any block (topology/none) its name
    and ``node``; a node in no block of a cluster that has some ``.gpu01`` (tree's empty switch level)."""
    if not blocks:
        return node, "node"
    return f"{blocks.get(node, '')}.{node}", "switch.node"


def set_gpus(env: dict[str, str], name: str, gpus: list[int], on_node: int) -> None:
    """The GPU variables, as Slurm's gres/gpu plugin sets them: ``name`` (SLURM_JOB_GPUS, SLURM_STEP_GPUS)
    and every runtime's ordinals with ``gpus``, SLURM_GPUS_ON_NODE with ``on_node`` (the GPUs of the job or
    step on this node); without GPUs none of them, whatever was inherited."""
    listed = ",".join(str(g) for g in gpus)
    for key in (name, *GPU_ORDINALS):
        if listed:
            env[key] = listed
        else:
            env.pop(key, None)
    if on_node:
        env["SLURM_GPUS_ON_NODE"] = str(on_node)
    else:
        env.pop("SLURM_GPUS_ON_NODE", None)


def base_environment(agent_env: Mapping[str, str], user: str, home: str, shell: str) -> dict[str, str]:
    """What every job starts from, under its exported environment: the user's login basics and where the
    cluster is. Never the agent's own environment: with ``--export=NONE`` a job gets only this, the job's
    variables and the ones it named."""
    env = {"HOME": home, "USER": user, "LOGNAME": user, "SHELL": shell, "PATH": DEFAULT_PATH}
    env.update({k: agent_env[k] for k in AGENT_VARIABLES if k in agent_env})
    return env


def tasks_per_node(ntasks: int, nodes: int, per_node: int | None) -> list[int]:
    """Tasks on each node: ``per_node`` each, or a block distribution of ``ntasks``."""
    if per_node is not None:
        return [per_node] * nodes
    base, extra = divmod(ntasks, nodes)
    return [base + (1 if i < extra else 0) for i in range(nodes)]


def compress_counts(counts: list[int]) -> str:
    """Slurm's repeated-count form: ``[2, 2, 2, 1]`` -> ``2(x3),1``."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        run = j - i
        out.append(f"{counts[i]}(x{run})" if run > 1 else str(counts[i]))
        i = j
    return ",".join(out)


def job_environment(
    order: LaunchOrder, base: dict[str, str], uid: int, gid: int, node: NodeEnv | None = None
) -> dict[str, str]:
    """The batch shell's environment on ``order.node`` (srun's steps start from it on each of the job's
    nodes): the submitter's exported environment plus the job's; ``uid`` and ``gid`` are the job owner's,
    whom it runs as (``identity.py``); ``node`` what the node adds. SLURM_TASK_PID is the task's own, set
    as it starts (``taskstart.py``)."""
    spec = order.spec
    node = node or NodeEnv()
    nodes = [a.node for a in order.allocations]
    here = next((a for a in order.allocations if a.node == order.node), order.allocations[0])
    nodelist = hostlist.compress(nodes)
    env = {k: v for k, v in base.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(spec.environment)
    topology = node.topology or (order.node, "node")
    env.update(
        {
            "SLURM_JOB_ID": str(order.job_id),
            "SLURM_JOBID": str(order.job_id),
            "SLURM_JOB_NAME": spec.name,
            "SLURM_JOB_USER": order.user,
            "SLURM_JOB_UID": str(uid),
            "SLURM_JOB_GID": str(gid),
            "SLURM_JOB_NODELIST": nodelist,
            "SLURM_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(len(nodes)),
            "SLURM_NNODES": str(len(nodes)),
            "SLURM_TASKS_PER_NODE": compress_counts(batch_tasks_per_node(order)),
            "SLURM_JOB_CPUS_PER_NODE": compress_counts([a.cpus for a in order.allocations]),
            "SLURM_CPUS_ON_NODE": str(here.cpus),
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_GTIDS": "0",
            "SLURMD_NODENAME": order.node,
            "HOSTNAME": order.node,
            "SLURM_TOPOLOGY_ADDR": topology[0],
            "SLURM_TOPOLOGY_ADDR_PATTERN": topology[1],
            "SLURM_RESTART_COUNT": str(order.attempt),
            "SLURM_SUBMIT_DIR": spec.workdir,
            "SLURM_SUBMIT_HOST": spec.submit_host,
            "SLURM_JOB_PARTITION": order.partition,
            "SLURM_JOB_ACCOUNT": order.account,
            "SLURM_JOB_QOS": spec.qos or "normal",
            "SLURM_CLUSTER_NAME": order.cluster,
            "ENVIRONMENT": "BATCH",
        }
    )
    if spec.open_mode == "append":
        # sbatch's --open-mode=append, which srun takes as the default of its own (Slurm's a; its t for an
        # explicit --open-mode=truncate is not told apart from the default, for which Slurm sets none)
        env["SLURM_OPEN_MODE"] = "a"
    if spec.reservation:
        env["SLURM_JOB_RESERVATION"] = spec.reservation
    # Slurm's batch shell has SLURM_NTASKS only with a task count (-n, or --ntasks-per-node), and
    # SLURM_NTASKS_PER_NODE only when --ntasks-per-node was given.
    if spec.ntasks_set:
        env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(spec.ntasks)
    if spec.ntasks_per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(spec.ntasks_per_node)
    if node.conf:
        env["SLURM_CONF"] = node.conf
    if node.tmpdir:
        env["TMPDIR"] = node.tmpdir
    else:
        env.setdefault("TMPDIR", SHARED_TMPDIR)
    env.update(array_environment(order))
    if spec.cpus_per_task > 1:
        env["SLURM_CPUS_PER_TASK"] = str(spec.cpus_per_task)
    if spec.mem_per_node_mb is not None:
        env["SLURM_MEM_PER_NODE"] = str(order.allocations[0].mem_mb)
    # The batch shell sees all of the node's GPUs; per-task binding (--gpus-per-task) is srun's.
    for name, value in (
        ("SLURM_GPUS_PER_TASK", spec.gpus_per_task),
        ("SLURM_CPUS_PER_GPU", spec.cpus_per_gpu),
    ):
        if value is not None:
            env[name] = str(value)
    set_gpus(env, "SLURM_JOB_GPUS", list(here.gpus), len(here.gpus))
    ids = parse_traceparent(order.traceparent)
    if ids is not None:
        # Jobs and steps submitted from inside the job continue its trace, under this run's attempt span
        # (the id the tracer derives), not under the submitter's exported TRACEPARENT.
        attempt_span = span_id_for(ids[0], order.job_id, order.attempt, "", "attempt")
        env["TRACEPARENT"] = f"00-{ids[0]}-{attempt_span}-01"
    return env


def batch_tasks_per_node(order: LaunchOrder) -> list[int]:
    """SLURM_TASKS_PER_NODE of the batch shell, as Slurm lays it out: the job's task count in blocks, or
    without one (no -n) as many tasks as each node's CPUs hold of ``-c``."""
    spec = order.spec
    if spec.ntasks_set:
        return tasks_per_node(spec.ntasks, len(order.allocations), spec.ntasks_per_node)
    return [max(a.cpus // spec.cpus_per_task, 1) for a in order.allocations]


def array_environment(order: LaunchOrder) -> dict[str, str]:
    """``SLURM_ARRAY_*`` of an array task (all of them, or none for a job that is not one)."""
    array = order.spec.array
    if order.array_task_id is None or array is None:
        return {}
    indices = array_indices(array)
    return {
        "SLURM_ARRAY_JOB_ID": str(order.array_job_id),
        "SLURM_ARRAY_TASK_ID": str(order.array_task_id),
        "SLURM_ARRAY_TASK_COUNT": str(len(indices)),
        "SLURM_ARRAY_TASK_MIN": str(indices[0]),
        "SLURM_ARRAY_TASK_MAX": str(indices[-1]),
        "SLURM_ARRAY_TASK_STEP": str(index_step(indices)),
    }


def expand_pattern(pattern: str, order: LaunchOrder) -> str:
    """Expand an output file pattern (``%j %J %A %a %x %u %N %n %t %%``) to an absolute path.

    ``%A`` is the array's id and ``%a`` the task's index for an array task; for another job ``%A`` is the
    job id and ``%a`` Slurm's 4294967294.
    """
    task = order.array_task_id
    values = {
        "j": str(order.job_id),
        "J": str(order.job_id),
        "A": str(order.array_job_id if task is not None else order.job_id),
        "a": str(task) if task is not None else NO_ARRAY_INDEX,
        "x": order.spec.name,
        "u": order.user,
        "N": order.node,
        "n": "0",
        "t": "0",
        "s": "batch",
        "%": "%",
    }
    return expand(pattern, values, order.spec.workdir)


def expand(pattern: str, values: dict[str, str], workdir: str) -> str:
    """Replace ``%k`` (with an optional zero-padding width, ``%4j``) by ``values[k]``; relative results are
    made absolute under ``workdir``. An unknown ``%k`` stays as it is."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            j = i + 1
            while j < len(pattern) and pattern[j].isdigit():
                j += 1  # zero-padding width, e.g. %4j
            key = pattern[j] if j < len(pattern) else ""
            if key in values:
                width = min(int(pattern[i + 1 : j] or 0), 10)  # Slurm caps the padding at 10
                value = values[key]
                out.append(value.zfill(width) if value.isdigit() else value)
                i = j + 1
                continue
        out.append(ch)
        i += 1
    path = "".join(out)
    return path if os.path.isabs(path) else os.path.join(workdir, path)


def output_paths(order: LaunchOrder) -> tuple[str, str | None]:
    """(stdout path, stderr path or None when merged into stdout)."""
    default = DEFAULT_ARRAY_OUTPUT if order.array_task_id is not None else DEFAULT_OUTPUT
    stdout = expand_pattern(order.spec.stdout or default, order)
    stderr = expand_pattern(order.spec.stderr, order) if order.spec.stderr else None
    return stdout, (None if stderr == stdout else stderr)
