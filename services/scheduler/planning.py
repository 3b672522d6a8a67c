"""The scheduler's plan, as its shell runs it.

- The pure core's big passes without the cyclic GC: a rebuild builds millions of small acyclic objects,
  and a plan over a deep queue allocates them by the hundred thousand; each collection they trigger would
  rescan the whole live heap. One place pauses it, for both.
- The leader's plan in a thread of its own (``aside``), so that the event loop goes on meanwhile: above all
  the lease's renewals. A plan can take longer than the lease (conservative backfill on thousands of nodes
  and tens of thousands of pending jobs: seconds to minutes); on the loop it held every renewal back, the
  leader's lease lapsed by its own clock while it planned, its decisions were refused, and the next cycle
  planned as long again: nothing was ever decided. The interpreter lets the loop run every few
  milliseconds of the plan's. Nothing may change the state while the thread reads it: ``FoldGate`` holds
  the fold back (``Scheduler.follow``) until what runs there returns, and the leader's plan until its
  decisions' sends have started.
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
#: A plan runs on the event loop after one that took less than this (and nothing runs in the thread), else in
#: the planning thread. Handing a plan to the thread and back costs a short plan ~10% of the scheduler's rate
#: (``bench/scheduler_flow.py``), and a plan that grows from under this to more than a lease (0.5 s at least)
#: in one cycle is at most one cycle refused: the next one runs in the thread.
INLINE_PLAN_S = 0.05
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
    """``fn(*args)`` in the planning thread, the loop running meanwhile. Cancelled (even again), it still
    returns only once the thread is done with its arguments (the caller's state must not change under it)."""
    done = asyncio.get_running_loop().run_in_executor(_PLANNER, fn, *args)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        while not done.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([done])
        raise


class FoldGate:
    """When the fold may change the state, given what reads it in the planning thread (``aside``).

    - ``run(fn, *args)``: ``fn`` in the thread; the fold waits until it returns. ``held`` returns with the
      gate still held, for the caller to ``release`` (once) later: the leader's plan holds it until its
      decisions' sends have started, since they read the jobs' sequences the plan saw (an entry folded
      first, a hold request, would let a decision taken before it through the conditional append).
    - ``fold_turn()``, awaited by the fold before each entry: while something holds the gate, it waits, and
      new callers wait behind it until the fold has caught up with the log (``caught_up``): steady work in
      the thread (``sbatch --test-only`` from many users, each a plan of the whole queue) cannot starve it.
    """

    def __init__(self) -> None:
        self.idle = asyncio.Event()  # set while nothing holds the gate
        self.idle.set()
        self._holders = 0
        self._fold_first = asyncio.Event()  # cleared while the fold waits, until it caught up
        self._fold_first.set()

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in the thread, the fold waiting until it returns."""
        result, release = await self.held(fn, *args)
        release()
        return result

    async def held(self, fn: Callable[..., T], *args: object) -> tuple[T, Callable[[], None]]:
        """``fn(*args)`` in the thread, and the release of the gate it leaves held (idempotent)."""
        await _set(self._fold_first)
        self._holders += 1
        self.idle.clear()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._holders -= 1
                if not self._holders:
                    self.idle.set()

        try:
            return await aside(fn, *args), release
        except BaseException:
            release()
            raise

    async def plan(self, last_s: float, fn: Callable[..., T], *args: object) -> tuple[T, Callable[[], None]]:
        """A plan ``fn(*args)``: on the loop if the last one took less than ``INLINE_PLAN_S`` (``last_s``) and
        nothing runs in the thread (the kept capacity is one plan's at a time), else as ``held``; and the
        release of the gate (nothing to release for a plan on the loop)."""
        if last_s < INLINE_PLAN_S and self.idle.is_set():
            return fn(*args), _nothing
        return await self.held(fn, *args)

    async def fold_turn(self) -> None:
        """Wait until the fold may change the state; from then on, until ``caught_up``, it goes first."""
        if not self.idle.is_set():
            self._fold_first.clear()
            await _set(self.idle)

    def caught_up(self) -> None:
        """The fold read the log's end (or stopped): the thread's callers may go."""
        self._fold_first.set()


async def _set(event: asyncio.Event) -> None:
    """Wait until ``event`` is set when this task runs again (``wait`` returns once it was set, even if it
    was cleared again before the waiter ran)."""
    while not event.is_set():
        await event.wait()


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


def _nothing() -> None:
    return None
