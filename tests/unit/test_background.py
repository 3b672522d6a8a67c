"""The agent's background tasks: kept until done, cancelled together, and a failed one logged at once."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from corral.services.agent.background import Background


async def test_a_task_that_fails_is_logged_with_its_error() -> None:
    async def report_exit() -> None:
        raise RuntimeError("the log refused it")

    background = Background()
    with capture_logs() as logs:
        background.spawn(report_exit())
        await asyncio.sleep(0.01)
    failed = [line for line in logs if line["event"] == "background task failed"]
    assert len(failed) == 1
    assert "report_exit" in failed[0]["task"] and "the log refused it" in failed[0]["error"]
    assert failed[0]["log_level"] == "error" and not background.tasks


async def test_cancelled_and_finished_tasks_log_nothing() -> None:
    background = Background()
    with capture_logs() as logs:
        background.spawn(asyncio.sleep(0))
        background.spawn(asyncio.sleep(60))
        await asyncio.sleep(0.01)
        await background.cancel()
    assert not [line for line in logs if line["event"] == "background task failed"]
    assert not background.tasks
