"""The shape of a submission, from sbatch's options: nodes and tasks, GPUs, memory per node and host lists
(``-N -n --ntasks-per-node``, ``--gres --gpus* -G``, ``--mem --mem-per-cpu --mem-per-gpu``, ``-w -x``).

Completed from each other as Slurm does; a bad combination is a ``CliError`` naming the options.
"""

from __future__ import annotations

import msgspec

from corral.cli.errors import CliError
from corral.cli.options import ParsedArgs, parse_count
from corral.libs.slurm.gres import parse_gpus_spec, parse_gres
from corral.libs.slurm.hostlist import expand
from corral.libs.slurm.memory import parse_memory


class Gpus(msgspec.Struct, frozen=True):
    """The job's GPUs as the options ask for them."""

    per_node: int  # GPUs on each node
    type: str | None  # GPU model; None = any
    per_task: int | None  # --gpus-per-task, if given


#: The options that say how many GPUs a job gets; at most one may be given.
GPU_OPTIONS = ("gpus-per-node", "gres", "gpus-per-task", "gpus")


def gpus_of(options: ParsedArgs, nodes: int, tasks_per_node: int) -> Gpus:
    """GPUs per node and their type from one of ``--gres=gpu``, ``--gpus-per-node``, ``--gpus-per-task``
    (per node: tasks per node times it) or ``-G/--gpus`` (spread evenly over the nodes)."""
    gres_text = options.last("gres")
    gpu_requests = []
    for request in parse_gres(gres_text, "--gres") if gres_text is not None else []:
        if request.name != "gpu":
            raise CliError(f"--gres={gres_text}: only gpu GRES are supported by Corral yet")
        gpu_requests.append(request)
    if len(gpu_requests) > 1:
        raise CliError(
            f"--gres={gres_text}: GPUs of several types in one job are not supported by Corral yet"
        )
    given = [n for n in GPU_OPTIONS if (gpu_requests if n == "gres" else options.given(n))]
    if len(given) > 1:
        first, second = (f"--{n}=gpu" if n == "gres" else f"--{n}" for n in given[:2])
        raise CliError(f"{first} and {second} are mutually exclusive")
    option = given[0] if given else None
    if option == "gres":
        return Gpus(gpu_requests[0].count, gpu_requests[0].type, None)
    if option is None:
        return Gpus(0, None, None)
    text = options.last(option) or ""
    gpu_type, count = parse_gpus_spec(text, f"--{option}")
    if option == "gpus-per-task":
        return Gpus(tasks_per_node * count, gpu_type, count)
    if option == "gpus":
        if count % nodes:
            raise CliError(
                f"--gpus={text}: {count} GPUs cannot be spread evenly over {nodes} nodes: "
                f"ask for a multiple of {nodes}, or use --gpus-per-node"
            )
        return Gpus(count // nodes, gpu_type, None)
    return Gpus(count, gpu_type, None)


def per_gpu_option(options: ParsedArgs, name: str, rival: str, gpus_per_node: int) -> str | None:
    """The value of a ``--X-per-gpu`` option: only with GPUs, and not with the option it replaces."""
    text = options.last(name)
    if text is None:
        return None
    if options.given(rival):
        raise CliError(f"--{name} and --{rival} are mutually exclusive")
    if not gpus_per_node:
        raise CliError(f"--{name} needs GPUs: add --gpus, --gpus-per-node, --gpus-per-task or --gres=gpu")
    return text


def memory_per_node(options: ParsedArgs, gpus_per_node: int, cpus: int) -> int | None:
    """Memory per node from ``--mem``, ``--mem-per-gpu`` (GPUs per node times it) or ``--mem-per-cpu``
    (the CPUs the job takes per node, ``cpus``, times it); Slurm allows only one of them."""
    given = [name for name in ("mem", "mem-per-cpu", "mem-per-gpu") if options.given(name)]
    if len(given) > 1:
        raise CliError("--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive")
    per_gpu = per_gpu_option(options, "mem-per-gpu", "mem", gpus_per_node)
    if per_gpu is not None:
        return gpus_per_node * parse_memory(per_gpu, "--mem-per-gpu")
    per_cpu = options.last("mem-per-cpu")
    if per_cpu is not None:
        return cpus * parse_memory(per_cpu, "--mem-per-cpu")
    mem = options.last("mem")
    return None if mem is None else parse_memory(mem, "--mem")


def host_list(options: ParsedArgs, name: str) -> list[str]:
    """The host names of ``-w/--nodelist`` or ``-x/--exclude`` (a hostlist; duplicates dropped)."""
    text = options.last(name)
    if text is None:
        return []
    if "/" in text:
        raise CliError(f"--{name}={text}: reading node names from a file is not supported by Corral yet")
    return list(dict.fromkeys(expand(text, f"--{name}")))


def task_counts(options: ParsedArgs, warnings: list[str], listed: int) -> tuple[int, int, int | None]:
    """nodes, ntasks and ntasks_per_node, completed from each other as Slurm does.

    ``listed`` is the number of ``-w`` nodes: the job has at least that many nodes.
    """
    nodes_text = options.last("nodes")
    if nodes_text is not None and "-" in nodes_text.strip("-"):
        raise CliError(f"--nodes={nodes_text}: node count ranges are not supported by Corral yet")
    nodes = max(parse_count(nodes_text, "--nodes") if nodes_text is not None else 1, listed)
    per_node_text = options.last("ntasks-per-node")
    per_node = parse_count(per_node_text, "--ntasks-per-node") if per_node_text is not None else None
    ntasks_text = options.last("ntasks")
    # Without -n, a job runs one task per node, or --ntasks-per-node on each.
    ntasks = parse_count(ntasks_text, "--ntasks") if ntasks_text is not None else nodes * (per_node or 1)
    if ntasks < nodes:
        warnings.append(f"can't run {ntasks} processes on {nodes} nodes, setting nnodes to {ntasks}")
        nodes = ntasks
    return nodes, ntasks, per_node
