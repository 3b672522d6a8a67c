"""The end of an interactive allocation (srun or salloc outside a job): ``AllocationRelease`` hands the
allocation's script (``ALLOCATION_SCRIPT``, which waits on a FIFO in its run directory) the exit code it
exits with, so the job ends through the usual ``RunExited`` path."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from pathlib import Path

from corral.schemas.api import LaunchOrder
from corral.schemas.steps import ALLOCATION_SCRIPT
from corral.services.agent.step_state import StepError

#: Seconds the agent tries to hand an interactive allocation its exit code.
RELEASE_TIMEOUT = 10.0


async def release(order: LaunchOrder, run_dir: Path, exit_code: int) -> None:
    """Write the exit code (clamped to 0-255) into the allocation script's FIFO, waiting for it to read."""
    if order.spec.script != ALLOCATION_SCRIPT:
        raise StepError(f"Job {order.job_id} is not an interactive allocation (srun/salloc)")
    fifo = run_dir / "release"
    code = f"{min(max(exit_code, 0), 255)}\n".encode()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RELEASE_TIMEOUT
    while True:
        with contextlib.suppress(FileExistsError):
            os.mkfifo(fifo)
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            # ENXIO: the script is not reading yet.
            if exc.errno != errno.ENXIO or loop.time() > deadline:
                raise StepError(f"cannot release job {order.job_id}: {exc.strerror}", "unavailable") from None
            await asyncio.sleep(0.05)
            continue
        try:
            os.write(fd, code)
        finally:
            os.close(fd)
        return
