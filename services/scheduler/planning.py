"""The scheduler's plan, as its shell runs it.

- The pure core's big passes without the cyclic GC: a rebuild builds millions of small acyclic objects,
  and a plan over a deep queue allocates them by the hundred thousand; each collection they trigger would
  rescan the whole live heap. One place pauses it, for both.
- The ``scheduling cycle`` span of a cycle that appends something.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from contextlib import AbstractContextManager

from opentelemetry import trace

from corral.libs.core import plan as planner
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.policy import Policy
from corral.libs.core.state import State
from corral.libs.runtime import telemetry
from corral.schemas import events as ev

_tracer = telemetry.tracer(__name__)


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


def plan_paused(
    state: State, now: float, policy: Policy, epoch: int, cache: CapacityCache | None = None
) -> planner.Plan:
    """``plan()`` with the cyclic GC paused (``cache``: the nodes' capacity kept from the last cycle)."""
    with gc_paused():
        return planner.plan(state, now, policy, epoch, cache)


def cycle_span(
    began_ns: int, decided: planner.Plan, changes: list[ev.JobReasonChanged]
) -> AbstractContextManager[object]:
    """The ``scheduling cycle`` span of a cycle that decided or logged something: its own root (a cycle is
    about many jobs, in no job's trace), from the plan's start to its last append. A cycle that appends
    nothing (most are woken by a fact that changes no plan) has no span, only its duration in the metrics'
    histogram: one per log entry would flood the backend with empty cycles."""
    if not decided.decisions and not changes:
        return contextlib.nullcontext()
    span = _tracer.start_span(
        "scheduling cycle",
        context=telemetry.extract(None),
        start_time=began_ns,
        attributes={
            "corral.cycle.jobs_considered": len(decided.priorities),
            "corral.cycle.decisions": len(decided.decisions),
            "corral.cycle.reason_changes": len(changes),
        },
    )
    return trace.use_span(span, end_on_exit=True)
