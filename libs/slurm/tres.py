"""Slurm's TRES strings, as sacct prints ``AllocTRES`` and ``ReqTRES``.

``billing=8,cpu=8,gres/gpu=2,mem=16G,node=1``:

Each item is ``name=count``; items with a zero count are left out, and the items are sorted by their text, as
Slurm sorts them (so a typed GPU entry comes before the untyped one: ``gres/gpu:h100=2,gres/gpu=2``, ':'
sorting before '='). Memory prints in the biggest unit that divides it exactly (``format_memory``). Corral
has no TRESBillingWeights, so ``billing`` is the CPU count, Slurm's default.
"""

from __future__ import annotations

from corral.libs.slurm.memory import format_memory


def tres_string(
    *,
    cpus: int,
    gpus: int = 0,
    gpu_type: str = "",
    mem_mb: int | None = None,
    nodes: int,
    billing: bool = True,
) -> str:
    """The TRES string of a job or step; ``billing`` False for a step (Slurm gives steps none)."""
    items = [f"cpu={cpus}"] if cpus else []
    if billing and cpus:
        items.append(f"billing={cpus}")
    if gpus:
        items.append(f"gres/gpu={gpus}")
        if gpu_type:
            items.append(f"gres/gpu:{gpu_type}={gpus}")
    if mem_mb:
        items.append(f"mem={format_memory(mem_mb)}")
    if nodes:
        items.append(f"node={nodes}")
    return ",".join(sorted(items))


def gres_string(gpus: int, gpu_type: str = "") -> str:
    """sacct's ``AllocGRES``/``ReqGRES``: ``gpu:2``, ``gpu:h100:2``, empty without GPUs."""
    if not gpus:
        return ""
    return f"gpu:{gpu_type}:{gpus}" if gpu_type else f"gpu:{gpus}"
