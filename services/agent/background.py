"""Background tasks of one part of the agent, kept so that stopping the agent cancels them all.

A task that is only referenced by the event loop may be garbage-collected mid-flight; keeping it in a set
until it ends prevents that, and lets ``cancel`` end every one of them at shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


class Background:
    """A set of running tasks: spawned, kept until done, cancelled together."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()  # running, not yet done

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in a task of its own, kept until it ends."""
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def cancel(self) -> None:
        """Cancel every task still running and wait for them to end."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
