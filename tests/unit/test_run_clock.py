"""A run's ``--signal`` warning and time limit on the agent's clock: a ``FakeClock`` moves a minute in
microseconds, while the run's supervisor is a real process that the kill sequence request reaches."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from corral.libs.runtime.clock import FakeClock
from corral.services.agent import killseq, procstat, runner
from corral.services.agent.records import Record, Records

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


async def test_the_warning_then_the_time_limit_fall_due_on_the_agents_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    # Stand-ins with real pids: the run's supervisor (what the kill request signals) and the script.
    supervisor = subprocess.Popen(["sleep", "300"], start_new_session=True)
    script = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        now = clock.now()
        rec = Record(
            job_id=1,
            attempt=0,
            pid=script.pid,
            supervisor=supervisor.pid,
            supervisor_start=procstat.start_ticks(supervisor.pid) or 0,
            started_at=now,
            deadline=now + 60,
            warn_signal=10,
            warn_before_s=10,
        )
        records = Records(tmp_path / "runs.jsonl")
        records.put(rec)
        warned: list[tuple[int, int, int]] = []
        run = runner.Run(rec, tmp_path, records, 5.0, step_signaller=lambda *w: warned.append(w), clock=clock)
        ending = asyncio.create_task(run.wait())
        await clock.asleep()
        clock.advance(49)
        await clock.asleep()
        assert warned == [] and killseq.requested(str(tmp_path)) is None
        clock.advance(1)  # --signal=USR1@10: ten seconds before the limit, to the run's steps
        await clock.asleep()
        assert warned == [(1, 0, 10)]
        assert records.get(1, 0) is not None and records.get(1, 0).warned  # type: ignore[union-attr]
        clock.advance(10)  # the limit: the supervisor is asked for its kill sequence, with KillWait
        outcome = await asyncio.wait_for(ending, 5)
        assert killseq.requested(str(tmp_path)) == 5.0
        assert supervisor.wait(5) == -15  # it got the request (SIGTERM)
        assert (outcome.timed_out, outcome.killed) == (True, False)
    finally:
        for proc in (supervisor, script):
            proc.kill()
            proc.wait()
