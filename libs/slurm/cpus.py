"""How many CPUs a job takes on each of its nodes (Slurm's rule, shared by sbatch and the placement).

Tasks are laid out in blocks, so the busiest node runs ``--ntasks-per-node`` tasks, or ``ceil(ntasks /
nodes)``; each task takes ``--cpus-per-task`` CPUs; ``--cpus-per-gpu`` raises that to the node's GPUs
times it. ``--mem-per-cpu`` is memory per CPU of this count.
"""

from __future__ import annotations


def cpus_per_node(
    nodes: int,
    ntasks: int,
    ntasks_per_node: int | None,
    cpus_per_task: int,
    gpus_per_node: int = 0,
    cpus_per_gpu: int | None = None,
) -> int:
    """CPUs a job takes on its busiest node."""
    tasks = ntasks_per_node or -(-max(ntasks, 1) // max(nodes, 1))
    cpus = tasks * max(cpus_per_task, 1)
    if cpus_per_gpu is not None and gpus_per_node:
        cpus = max(cpus, gpus_per_node * cpus_per_gpu)
    return cpus
