"""The batch job's environment and output paths (pure): what SLURM_CONTRACT.md promises scripts."""

from __future__ import annotations

import os.path
from collections.abc import Mapping

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


def job_environment(order: LaunchOrder, base: dict[str, str], uid: int, gid: int) -> dict[str, str]:
    """The batch shell's environment: the submitter's exported environment plus the job's; ``uid`` and
    ``gid`` are the job owner's, whom it runs as (``identity.py``)."""
    spec = order.spec
    nodes = [a.node for a in order.allocations]
    nodelist = hostlist.compress(nodes)
    ntasks_each = tasks_per_node(spec.ntasks, len(nodes), spec.ntasks_per_node)
    ntasks = sum(ntasks_each)
    gpus = ",".join(str(g) for g in order.allocations[0].gpus)
    env = {k: v for k, v in base.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(spec.environment)
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
            "SLURM_NTASKS": str(ntasks),
            "SLURM_NPROCS": str(ntasks),
            "SLURM_NTASKS_PER_NODE": str(spec.ntasks_per_node or ntasks_each[0]),
            "SLURM_TASKS_PER_NODE": compress_counts(ntasks_each),
            "SLURM_JOB_CPUS_PER_NODE": compress_counts([a.cpus for a in order.allocations]),
            "SLURM_CPUS_ON_NODE": str(order.allocations[0].cpus),
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURMD_NODENAME": order.node,
            "SLURM_RESTART_COUNT": str(order.attempt),
            "SLURM_SUBMIT_DIR": spec.workdir,
            "SLURM_SUBMIT_HOST": spec.submit_host,
            "SLURM_JOB_PARTITION": order.partition,
            "SLURM_JOB_ACCOUNT": order.account,
            "SLURM_JOB_QOS": spec.qos or "normal",
            "SLURM_CLUSTER_NAME": order.cluster,
            "SLURM_GPUS_ON_NODE": str(len(order.allocations[0].gpus)),
            "ENVIRONMENT": "BATCH",
            # sbatch's --open-mode, which srun takes as the default of its own (Slurm's a|t).
            "SLURM_OPEN_MODE": "a" if spec.open_mode == "append" else "t",
        }
    )
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
    if gpus:
        env["SLURM_JOB_GPUS"] = gpus
        env["CUDA_VISIBLE_DEVICES"] = gpus
    else:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    ids = parse_traceparent(order.traceparent)
    if ids is not None:
        # Jobs and steps submitted from inside the job continue its trace, under this run's attempt span
        # (the id the tracer derives), not under the submitter's exported TRACEPARENT.
        attempt_span = span_id_for(ids[0], order.job_id, order.attempt, "", "attempt")
        env["TRACEPARENT"] = f"00-{ids[0]}-{attempt_span}-01"
    return env


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
