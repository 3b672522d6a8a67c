"""The pure core's big passes without the cyclic GC: a rebuild builds millions of small acyclic objects,
and a plan over a deep queue allocates them by the hundred thousand; each collection they trigger would
rescan the whole live heap. One place pauses it, for both.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from corral.libs.core import plan as planner
from corral.libs.core.policy import Policy
from corral.libs.core.state import State


@contextlib.contextmanager
def gc_paused(freeze: bool = False) -> Iterator[None]:
    """The block runs with the cyclic GC off (as it was before, after it); ``freeze`` moves what the block
    built out of the GC's way for good (a rebuilt state lives as long as the process)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


def plan_paused(state: State, now: float, policy: Policy, epoch: int) -> planner.Plan:
    """``plan()`` with the cyclic GC paused."""
    with gc_paused():
        return planner.plan(state, now, policy, epoch)
