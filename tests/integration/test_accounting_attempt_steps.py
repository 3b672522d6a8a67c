"""Every attempt keeps its steps: ``sacct -D`` shows each requeued run's steps under that run (Slurm's step
records belong to the job record they ran in), plain ``sacct`` the latest attempt's; dropping the database
and replaying the log rebuilds the same rows, and migration 005 rebuilds a database that lost them."""

from __future__ import annotations

import pytest
from test_accounting import Rig, allocated, call, rig, servers, submitted

from corral.schemas import events as ev
from corral.schemas.api import AcctJob, AcctReply, AcctRequest, AcctStep

pytestmark = pytest.mark.integration

__all__ = ["rig", "servers"]  # the fixtures this module uses from test_accounting

NODE = ev.NodeName("gpu01")


def step_started(attempt: int, step: int) -> ev.StepStarted:
    return ev.StepStarted(
        job_id=ev.JobId(7), attempt=attempt, step_id=step, node=NODE, name="train", nodes=[NODE], ntasks=1
    )


#: Job 7 runs steps 0 (completes) and 1 (still running) in attempt 0, its node dies, it is requeued and
#: runs step 0 again in attempt 1.
REQUEUED_WITH_STEPS: list[ev.Event] = [
    ev.NodeRegistered(node=NODE, cpus=32, mem_mb=65536, gpus=8),  # seq 1
    submitted(7),
    allocated(7, 0, ["gpu01"]),
    step_started(0, 0),
    ev.StepExited(job_id=ev.JobId(7), attempt=0, step_id=0, node=NODE, exit_code=0),  # seq 5
    step_started(0, 1),
    ev.NodeDown(node=NODE, reason="Not responding"),
    ev.JobRequeued(job_id=ev.JobId(7), attempt=0, reason="NodeFail"),
    ev.NodeUp(node=NODE),
    # GPUs 0-1 stay held until attempt 0's batch script is seen to exit (as in the fold).
    allocated(7, 1, ["gpu01"], gpus=(2, 3)),  # seq 10
    step_started(1, 0),
]


async def job_7(rig: Rig, duplicates: bool) -> AcctJob:
    reply = await call(rig, "acct", AcctRequest(job_ids=[7], duplicates=duplicates), AcctReply)
    assert isinstance(reply, AcctReply), reply
    [job] = reply.jobs
    return job


def steps_of(steps: list[AcctStep]) -> list[tuple[str, str]]:
    return [(s.step, s.state) for s in steps]


async def test_each_attempts_steps_are_shown_under_it_with_duplicates(rig: Rig) -> None:
    await rig.append(*REQUEUED_WITH_STEPS[:9])  # requeued, pending again
    await rig.start()
    await rig.caught_up()
    first_run = [("batch", "REQUEUED"), ("0", "COMPLETED"), ("1", "CANCELLED")]
    pending = await job_7(rig, duplicates=False)
    assert (pending.state, steps_of(pending.steps)) == ("PENDING", first_run)  # the requeued run's, as before
    pending = await job_7(rig, duplicates=True)
    assert [(a.attempt, steps_of(a.steps)) for a in pending.attempts] == [(0, first_run)]
    assert pending.steps == []  # the pending record ran nothing yet
    await rig.append(*REQUEUED_WITH_STEPS[9:])
    await rig.caught_up()
    second_run = [("batch", "RUNNING"), ("0", "RUNNING")]
    plain = await job_7(rig, duplicates=False)
    assert (plain.attempts, steps_of(plain.steps)) == ([], second_run)
    every = await job_7(rig, duplicates=True)
    assert [(a.attempt, a.state, steps_of(a.steps)) for a in every.attempts] == [(0, "NODE_FAIL", first_run)]
    assert every.attempts[0].steps[1].end_time is not None and every.steps == plain.steps


async def test_dropping_the_database_and_replaying_gives_the_same_steps(rig: Rig) -> None:
    await rig.append(*REQUEUED_WITH_STEPS)
    await rig.start()
    await rig.caught_up()
    before = await rig.dump()
    assert len(before[1]) == 5  # attempt 0's three steps, attempt 1's two
    await rig.stop()
    await rig.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
    await rig.start()
    await rig.caught_up()
    assert await rig.dump() == before


async def test_the_attempt_steps_migration_rebuilds_an_older_database_from_the_log(rig: Rig) -> None:
    await rig.append(*REQUEUED_WITH_STEPS)
    await rig.start()
    await rig.caught_up()
    expected = await rig.dump()
    await rig.stop()
    # The database as the release before 005 left it: one row per (job, step), attempt 0's steps gone.
    await rig.execute(
        "DELETE FROM steps WHERE attempt < 1; ALTER TABLE steps DROP CONSTRAINT steps_pkey;"
        " ALTER TABLE steps ADD PRIMARY KEY (job_id, step); DELETE FROM schema_migrations WHERE version = 5"
    )
    await rig.start()  # migrates (emptying the tables and the position), then replays the whole log

    async def migrated() -> bool:
        return await rig.sql("SELECT 1 FROM schema_migrations WHERE version = 5") == [(1,)]

    await rig.until(migrated, "005 is applied")
    await rig.caught_up()
    assert await rig.dump() == expected
