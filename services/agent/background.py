"""Background tasks of one part of the agent, kept so that stopping the agent cancels them all.

A task that is only referenced by the event loop may be garbage-collected mid-flight; keeping it in a set
until it ends prevents that, and lets ``cancel`` end every one of them at shutdown. A task that ends with an
exception is logged at once (``background task failed``, with its traceback), not left to asyncio's "Task
exception was never retrieved" on stderr at some later garbage collection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from corral.libs.runtime import telemetry


class Background:
    """A set of running tasks: spawned, kept until done, cancelled together."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()  # running, not yet done
        self.log = telemetry.logger()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in a task of its own, kept until it ends."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        coro = task.get_coro()
        name = getattr(coro, "__qualname__", task.get_name())
        self.log.error("background task failed", task=name, error=repr(error), exc_info=error)

    async def cancel(self) -> None:
        """Cancel every task still running and wait for them to end."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
