"""The node's GPU inventory: from NVML when a driver is present, from the cluster config otherwise.

NVML comes from ``nvidia-ml-py`` (``pip install 'corral[gpu]'``); without the package or without a driver,
the configured count is used as is (CPU-only machines run simulated GPU nodes). A node whose detected GPU
count differs from its configuration registers drained, with Slurm's reason, so nothing is placed on GPUs
that are not there (or on a node whose configuration is wrong) until an admin resumes it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from corral.libs.config.cluster import NodeConfig

#: Detects the GPUs of this machine: (count, model) or None when it cannot tell (no NVML, no driver).
Detector = Callable[[], "tuple[int, str | None] | None"]


@dataclass(frozen=True)
class Inventory:
    """What the node registers with."""

    gpus: int  # GPUs to register
    gpu_type: str | None  # GPU model
    drain_reason: str  # "" = usable; else why the node registers drained


def nvml_gpus() -> tuple[int, str | None] | None:
    """(count, model of GPU 0) from NVML; None without nvidia-ml-py or without a driver."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded: no driver here
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        model = None
        if count:
            name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
            model = name.decode() if isinstance(name, bytes) else str(name)
        return count, model
    finally:
        nvml.nvmlShutdown()


def inventory(node: NodeConfig, detect: Detector = nvml_gpus) -> Inventory:
    """The node's registration inventory: the configured GPUs, drained when detection disagrees."""
    found = detect()
    if found is None or found[0] == node.gpus:
        return Inventory(node.gpus, node.gpu_type, "")
    count = found[0]
    way = "lower" if count < node.gpus else "higher"
    return Inventory(
        node.gpus, node.gpu_type, f"gres/gpu count reported {way} than configured ({count} != {node.gpus})"
    )
