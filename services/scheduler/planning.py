"""The scheduler's plan, as its shell runs it.

- The pure core's big passes without the cyclic GC: a rebuild builds millions of small acyclic objects,
  and a plan over a deep queue allocates them by the hundred thousand; each collection they trigger would
  rescan the whole live heap. One place pauses it, for both.
- The leader's plan in a thread of its own (``aside``), so that the event loop goes on meanwhile: above all
  the lease's renewals. A plan can take longer than the lease (conservative backfill on thousands of nodes
  and tens of thousands of pending jobs: seconds to minutes); on the loop it held every renewal back, the
  leader's lease lapsed by its own clock while it planned, its decisions were refused, and the next cycle
  planned as long again: nothing was ever decided. The interpreter lets the loop run every few
  milliseconds of the plan's. Nothing may change the state while the thread reads it: the caller holds the
  fold back until the plan returns (``Scheduler.follow``).
- The ``scheduling cycle`` span of a cycle that appends something.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TypeVar

from opentelemetry import trace

from corral.libs.core import plan as planner
from corral.libs.core.capacity import CapacityCache
from corral.libs.core.policy import Policy
from corral.libs.core.state import State
from corral.libs.runtime import telemetry
from corral.schemas import events as ev

_tracer = telemetry.tracer(__name__)
T = TypeVar("T")
#: The thread the leader's plans run in (one: a cycle plans once, under the cycle's lock).
_PLANNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scheduler-plan")


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


async def aside(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in the planning thread, the loop running meanwhile. Cancelled, it still returns only
    once the thread is done with its arguments (the caller's state must not change under it)."""
    done = asyncio.get_running_loop().run_in_executor(_PLANNER, fn, *args)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        await asyncio.wait([done])
        raise


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
