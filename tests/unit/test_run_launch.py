"""A run's launch cut short by an agent stop: the restarted agent adopts the run with its time limit."""

from __future__ import annotations

import asyncio
import getpass
import os
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_jobenv import launch as launch_order

from corral.schemas.api import LaunchOrder
from corral.services.agent import runner
from corral.services.agent.identity import Identities
from corral.services.agent.records import Records

pytestmark = pytest.mark.unit

BASE_ENV = {"PATH": os.defpath}
#: The test's own user, whom its jobs run as.
OWNER = Identities("n1", allow_root_jobs=True).of(getpass.getuser())


def order_for(tmp_path: Path) -> LaunchOrder:
    """A 2 s job that would sleep a minute, with a --signal warning 1 s before its limit."""
    order = launch_order(workdir=str(tmp_path))
    spec = msgspec.structs.replace(order.spec, script="#!/bin/bash\nsleep 60\n", stdout=str(tmp_path / "out"))
    return msgspec.structs.replace(order, time_limit_s=2, spec=spec)


def fresh_records(tmp_path: Path, order: LaunchOrder) -> Records:
    records = Records(tmp_path / "runs.jsonl")
    records.put(runner.launch_record(order, time.time()))  # as the agent does before launching
    return records


async def test_the_time_limit_is_recorded_before_the_supervisor_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order = order_for(tmp_path)
    records = fresh_records(tmp_path, order)

    async def stopped_here(*args: Any, **kwargs: Any) -> Any:
        raise asyncio.CancelledError  # the agent's SIGTERM lands as the supervisor is being started

    monkeypatch.setattr(runner.Supervisors, "start", stopped_here)
    with pytest.raises(asyncio.CancelledError):
        await runner.start(order, tmp_path / "run", BASE_ENV, records, 1.0, owner=OWNER)
    left = Records(tmp_path / "runs.jsonl").runs[(order.job_id, order.attempt)]
    assert left.supervisor == 0
    assert left.deadline is not None and left.deadline - left.started_at == 2


async def test_a_run_adopted_from_its_pids_file_keeps_its_time_limit(tmp_path: Path) -> None:
    order = order_for(tmp_path)
    records = fresh_records(tmp_path, order)
    run_dir = tmp_path / "run"
    started = await runner.start(order, run_dir, BASE_ENV, records, 1.0, owner=OWNER)
    # what an agent stopped before it recorded the handshake leaves: the limits, no supervisor
    records.put(msgspec.structs.replace(started.rec, supervisor=0, supervisor_start=0, pid=0))
    left = Records(tmp_path / "runs.jsonl").runs[(order.job_id, order.attempt)]
    adopted = runner.adopt(left, run_dir, Records(tmp_path / "runs.jsonl"), 1.0)
    assert adopted.rec.supervisor == started.rec.supervisor  # completed from the pids file
    outcome = await asyncio.wait_for(adopted.wait(), 30)
    assert outcome.timed_out, outcome
