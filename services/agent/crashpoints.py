"""Named points of the agent's launch paths (a batch script's, a step's) and of its record file's compaction
where a failure test makes the agent die (``--crash-at``).

Failure is the normal case: an agent can die anywhere, and what it left on disk (its run records, the
run's directory) and the supervisors it started must be enough for the next agent process to re-adopt
every run exactly once. The restart and adoption table test (``tests/e2e/test_e2e_adoption.py``) stops the
agent at each launch point with ``os._exit`` (no cleanup, as SIGKILL), then restarts it; the records' tests
(``tests/unit/test_agent_records.py``) stop a compaction at each of its points. Unarmed, a point does
nothing.
"""

from __future__ import annotations

import os

#: The points, in the order a launch (then a compaction) reaches them.
POINTS = (
    "launch.recorded",  # the launch record is written; nothing started
    "launch.supervisor_started",  # the supervisor process exists; its handshake is not read
    "launch.handshake_recorded",  # the supervisor's pids are recorded; RunStarted is not appended
    "launch.started_reported",  # RunStarted is appended and recorded
    "step.supervisor_started",  # a step's supervisor exists here; its handshake is not read
    "step.started",  # its tasks run; srun has no answer yet
    "records.compact_written",  # the compacted record file is written and fsynced, not renamed over the old
    "records.compact_renamed",  # the compacted record file replaced the old one; its directory is not fsynced
)

#: The agent's exit status at an armed point.
CRASH_EXIT = 97


class CrashPoints:
    """The agent's crash points; ``armed`` is the one that ends the process (None: none)."""

    def __init__(self, armed: str | None = None) -> None:
        if armed is not None and armed not in POINTS:
            raise ValueError(f"--crash-at: unknown point {armed!r}; one of {', '.join(POINTS)}")
        self.armed = armed

    def reached(self, name: str) -> None:
        """The launch (or compaction) reached ``name``: die here if armed for it."""
        assert name in POINTS, name
        if name == self.armed:
            os._exit(CRASH_EXIT)
