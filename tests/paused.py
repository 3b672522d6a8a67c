"""Pausing a process for a test: SIGSTOP, then wait until the kernel shows it stopped.

The signal is not taken at once: a test that sends a request right after ``kill(pid, SIGSTOP)`` may still
be answered (nats-server was, in a third of the runs of ``test_leadership``), and a test that relies on the
pause then fails now and then.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

#: Seconds a process may take to stop.
STOP_S = 5.0


def pause(pid: int) -> None:
    """SIGSTOP ``pid`` and return once it is stopped (its state ``T`` in ``/proc/<pid>/stat``)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_S
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline, f"process {pid} did not stop in {STOP_S:.0f} s"
        time.sleep(0.001)
