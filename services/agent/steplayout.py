"""A step's task layout and each task's environment (pure): what ``srun`` promises the tasks.

Layout (Slurm's block distribution over the job's nodes, batch node first): ``-N`` nodes (default: as
many as the tasks need, at most the job's), ``-n`` tasks (default: one per node, or ``--ntasks-per-node``
on each), task ids in node order, local ids from 0 on each node. With ``--gpus-per-task=G`` each task
gets its own G indices of its node's allocated GPUs (task k on a node: the k-th slice); without it every
task sees all of its node's GPUs.
"""

from __future__ import annotations

from corral.libs.slurm import hostlist
from corral.schemas.api import LaunchOrder
from corral.schemas.events import NodeAllocation
from corral.schemas.steps import StepLaunch, TaskPlace
from corral.services.agent.jobenv import NO_ARRAY_INDEX, compress_counts, expand, set_gpus


class StepLayoutError(Exception):
    """The step cannot be laid out on the job's allocation; the message is Slurm's reason."""


def layout(
    allocations: list[NodeAllocation],
    *,
    ntasks: int | None = None,
    nodes: int | None = None,
    ntasks_per_node: int | None = None,
    cpus_per_task: int = 1,
    gpus_per_task: int | None = None,
) -> list[TaskPlace]:
    """The step's tasks on the job's nodes, in task order; StepLayoutError if they do not fit."""
    avail = len(allocations)
    for name, value in (("ntasks", ntasks), ("nodes", nodes), ("ntasks-per-node", ntasks_per_node)):
        if value is not None and value < 1:
            raise StepLayoutError(f"--{name} must be at least 1")
    if nodes is not None and nodes > avail:
        raise StepLayoutError(f"Requested node configuration is not available (only {avail} nodes allocated)")
    if ntasks is None:
        count = nodes or avail
        ntasks = count * (ntasks_per_node or 1)
    if nodes is None:
        need = -(-ntasks // ntasks_per_node) if ntasks_per_node else ntasks
        nodes = min(avail, need)
    if ntasks_per_node is not None and ntasks_per_node * nodes < ntasks:
        raise StepLayoutError(
            f"{ntasks} tasks do not fit on {nodes} nodes with --ntasks-per-node={ntasks_per_node}"
        )
    nodes = min(nodes, ntasks)  # Slurm: can't run N processes on more nodes; uses N nodes
    counts = _block(ntasks, nodes, ntasks_per_node)
    places: list[TaskPlace] = []
    for index, (alloc, count) in enumerate(zip(allocations[:nodes], counts, strict=True)):
        if count * cpus_per_task > alloc.cpus:
            raise StepLayoutError(
                f"More processors requested than permitted: {count} tasks x {cpus_per_task} CPUs on "
                f"{alloc.node}, which has {alloc.cpus} allocated"
            )
        if gpus_per_task is not None and count * gpus_per_task > len(alloc.gpus):
            raise StepLayoutError(
                f"Requested GPU configuration is not available: {count} tasks x {gpus_per_task} GPUs on "
                f"{alloc.node}, which has {len(alloc.gpus)} allocated"
            )
        for local in range(count):
            gpus = (
                list(alloc.gpus[local * gpus_per_task : (local + 1) * gpus_per_task])
                if gpus_per_task is not None
                else list(alloc.gpus)
            )
            places.append(
                TaskPlace(task=len(places), node=alloc.node, node_index=index, local_id=local, gpus=gpus)
            )
    return places


def _block(ntasks: int, nodes: int, per_node: int | None) -> list[int]:
    """Tasks per node: at most ``per_node`` each in node order, else as even as possible."""
    if per_node is None:
        base, extra = divmod(ntasks, nodes)
        return [base + (1 if i < extra else 0) for i in range(nodes)]
    counts: list[int] = []
    left = ntasks
    for _ in range(nodes):
        counts.append(min(per_node, left))
        left -= counts[-1]
    return counts


def step_nodes(places: list[TaskPlace]) -> list[str]:
    """The step's nodes, in node order."""
    return list(dict.fromkeys(p.node for p in places))


#: What a step's tasks take from srun's environment as it is, as Slurm's do (slurmstepd sets these for a batch
#: shell only, or for no step): inside a batch job the batch shell's values on every node (its HOSTNAME,
#: ``ENVIRONMENT=BATCH``, its SLURM_JOB_GPUS), none from srun outside a job; and srun's SLURM_UMASK.
FROM_SRUN = ("HOSTNAME", "ENVIRONMENT", "SLURM_JOB_GPUS", "SLURM_UMASK")


def task_environment(
    job_env: dict[str, str], place: TaskPlace, places: list[TaskPlace], step_id: int, launch: StepLaunch
) -> dict[str, str]:
    """One task's environment: the job's environment on its node (``jobenv.job_environment``) plus
    the step's and the task's own variables (SLURM_TASK_PID is set as it starts: ``taskstart.py``)."""
    nodes = step_nodes(places)
    counts = [sum(1 for p in places if p.node == n) for n in nodes]
    here = [p for p in places if p.node == place.node]
    step_list = hostlist.compress(nodes)
    env = dict(job_env)
    env.update(
        {
            "SLURM_STEP_ID": str(step_id),
            "SLURM_STEPID": str(step_id),
            "SLURM_STEP_NODELIST": step_list,
            "SLURM_STEP_NUM_NODES": str(len(nodes)),
            "SLURM_STEP_NUM_TASKS": str(len(places)),
            "SLURM_STEP_TASKS_PER_NODE": compress_counts(counts),
            "SLURM_NODELIST": step_list,
            "SLURM_NNODES": str(len(nodes)),
            "SLURM_NTASKS": str(len(places)),
            "SLURM_NPROCS": str(len(places)),
            "SLURM_TASKS_PER_NODE": compress_counts(counts),
            "SLURM_PROCID": str(place.task),
            "SLURM_LOCALID": str(place.local_id),
            "SLURM_NODEID": str(place.node_index),
            "SLURM_GTIDS": ",".join(str(p.task) for p in here),
            "SLURMD_NODENAME": place.node,
            # srun's default distribution (-m): cyclic when every node has one task at most, else block
            "SLURM_DISTRIBUTION": "cyclic" if len(places) <= len(nodes) else "block",
        }
    )
    for name in FROM_SRUN:
        if name in launch.environment:
            env[name] = launch.environment[name]
        else:
            env.pop(name, None)
    if launch.srun_host:
        env["SLURM_LAUNCH_NODE_IPADDR"] = env["SLURM_SRUN_COMM_HOST"] = launch.srun_host
    if launch.srun_port:
        env["SLURM_SRUN_COMM_PORT"] = env["SLURM_STEP_LAUNCHER_PORT"] = str(launch.srun_port)
    # srun's --ntasks-per-node (whose default is the job's, SLURM_NTASKS_PER_NODE): none without one
    if launch.ntasks_per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(launch.ntasks_per_node)
    else:
        env.pop("SLURM_NTASKS_PER_NODE", None)
    if launch.cpus_per_task > 1:
        env["SLURM_CPUS_PER_TASK"] = str(launch.cpus_per_task)
    if launch.gpus_per_task is not None:
        env["SLURM_GPUS_PER_TASK"] = str(launch.gpus_per_task)
    # Each task its own GPUs; SLURM_GPUS_ON_NODE counts the step's on the node.
    set_gpus(env, "SLURM_STEP_GPUS", list(place.gpus), len({g for p in here for g in p.gpus}))
    return env


def expand_step_pattern(
    pattern: str, order: LaunchOrder, step_id: int, place: TaskPlace, workdir: str
) -> str:
    """Expand an srun ``-o/-e`` pattern for one task (``%j %J %A %a %t %n %N %s %x %u %%``, widths as
    ``%4t``) to an absolute path."""
    task = order.array_task_id
    values = {
        "j": str(order.job_id),
        "J": f"{order.job_id}.{step_id}",
        "A": str(order.array_job_id if task is not None else order.job_id),
        "a": str(task) if task is not None else NO_ARRAY_INDEX,
        "x": order.spec.name,
        "u": order.user,
        "N": place.node,
        "n": str(place.node_index),
        "t": str(place.task),
        "s": str(step_id),
        "%": "%",
    }
    return expand(pattern, values, workdir)
