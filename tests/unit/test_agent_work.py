"""The agent's work orders on the in-memory log (``MemLog``) with the node's steps faked: what it reports,
and when, in milliseconds. The e2e tests run the same code against real processes, NATS and supervisors."""

from __future__ import annotations

import asyncio
import getpass
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from nats.aio.msg import Msg
from test_jobenv import launch

from corral.libs.runtime import telemetry
from corral.libs.runtime.clock import FakeClock
from corral.libs.runtime.errors import InvalidInput
from corral.libs.runtime.memlog import MemLog
from corral.schemas import api
from corral.schemas import events as ev
from corral.schemas.codec import encode
from corral.services.agent import confine, records
from corral.services.agent.crashpoints import CrashPoints
from corral.services.agent.identity import Identities
from corral.services.agent.records import RETENTION_S, Record, Records
from corral.services.agent.reporting import Reporter
from corral.services.agent.runs import Runs
from corral.services.agent.work import STALE_ATTEMPT, Work
from tests.unit.builders import cluster_config

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def launch_order(**fields: Any) -> api.LaunchOrder:
    """A launch order of a job of this test's own user (the one its scripts can run as)."""
    return launch(user=getpass.getuser(), **fields)


@dataclass
class FakeSteps:
    """The node's steps, as the runs see them (``work.RunSteps``): calls recorded; ``end_run`` returns once
    ``gone`` is set (the run's tasks here are gone)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    def signal_run(self, job_id: int, attempt: int, sig: int, *, everywhere: bool) -> None:
        self.calls.append(("signal_run", job_id, attempt, sig, everywhere))

    def kill_run_here(self, job_id: int, attempt: int, grace: float) -> None:
        self.calls.append(("kill_run_here", job_id, attempt, grace))

    async def end_run(self, job_id: int, attempt: int, grace: float | None = None) -> None:
        self.calls.append(("end_run", job_id, attempt, grace))
        await self.gone.wait()

    def had_oom(self, job_id: int, attempt: int) -> bool:
        return False

    def cgroups_in_use(self) -> set[str]:
        return set()


@dataclass
class Node:
    """One node's work consumer on a MemLog."""

    work: Work
    log: MemLog
    steps: FakeSteps

    def exits(self) -> list[ev.RunExited]:
        return [b for b in self.log.bodies() if isinstance(b, ev.RunExited)]


def node(tmp_path: Path, name: str = "gpu02", clock: FakeClock | None = None) -> Node:
    config = cluster_config(nodes=2)
    log, steps = MemLog(), FakeSteps()
    logger = telemetry.logger(node=name)
    runs = Runs(tmp_path, confine.RunCgroups(None, "test", config.node(name), logger), clock=clock)
    reporter = Reporter(log, name, runs.records, logger)
    # whoever runs the tests (root in CI) may run its jobs here
    identities = Identities(name, allow_root_jobs=True)
    work = Work(
        name,
        config,
        runs,
        reporter,
        steps,
        {"PATH": "/bin"},
        CrashPoints(),
        logger,
        clock=clock,
        identities=identities,
    )
    return Node(work, log, steps)


async def settle() -> None:
    """Let the work's background tasks run until they wait."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_peer_reports_a_killed_run_gone_only_once_its_tasks_here_are_gone(tmp_path: Path) -> None:
    peer = node(tmp_path)
    await peer.work.kill(api.KillOrder(job_id=7, attempt=0, node="gpu02", reason="requeue", grace_s=4.0))
    await settle()
    # The tasks got the kill sequence at once (with the order's grace), and are being waited for.
    assert peer.steps.calls[:2] == [("kill_run_here", 7, 0, 4.0), ("end_run", 7, 0, 4.0)]
    assert peer.exits() == []  # its GPUs stay held: the tasks may still be checkpointing
    peer.steps.gone.set()
    await settle()
    (exit,) = peer.exits()
    assert (exit.job_id, exit.attempt, exit.node, exit.killed, exit.signal) == (7, 0, "gpu02", True, 15)
    # A redelivered kill order changes nothing: the run is already recorded as killed and reported here.
    await peer.work.kill(api.KillOrder(job_id=7, attempt=0, node="gpu02", reason="requeue"))
    await settle()
    assert len(peer.exits()) == 1


async def test_a_kill_order_without_a_grace_waits_killwait(tmp_path: Path) -> None:
    peer = node(tmp_path)
    peer.steps.gone.set()
    await peer.work.kill(api.KillOrder(job_id=7, attempt=1, node="gpu02", reason="cancel"))
    await settle()
    assert ("kill_run_here", 7, 1, peer.work.config.kill_wait_s) in peer.steps.calls
    assert [e.attempt for e in peer.exits()] == [1]


async def test_a_launch_older_than_an_attempt_seen_here_is_refused_and_reported(tmp_path: Path) -> None:
    batch = node(tmp_path, "gpu01")
    batch.steps.gone.set()
    await batch.work.kill(api.KillOrder(job_id=7, attempt=2, node="gpu01", reason="requeue"))
    await settle()
    await batch.work.launch(launch_order(job_id=7, attempt=1, workdir=str(tmp_path)))
    stale = [e for e in batch.exits() if e.attempt == 1]
    assert [(e.launch_error, e.exit_code) for e in stale] == [(STALE_ATTEMPT, 1)]
    # and its redelivery does nothing more
    await batch.work.launch(launch_order(job_id=7, attempt=1, workdir=str(tmp_path)))
    assert len([e for e in batch.exits() if e.attempt == 1]) == 1


async def test_a_launch_that_cannot_start_is_reported_with_why(tmp_path: Path) -> None:
    batch = node(tmp_path, "gpu01")
    batch.steps.gone.set()
    await batch.work.launch(launch_order(job_id=8, attempt=0, workdir=str(tmp_path / "missing")))
    (exit,) = batch.exits()
    assert exit.launch_error == f"cannot chdir to {tmp_path / 'missing'}: no such directory"
    assert not [b for b in batch.log.bodies() if isinstance(b, ev.RunStarted)]


async def test_a_signal_order_for_a_run_not_live_here_reaches_only_its_step_tasks(tmp_path: Path) -> None:
    peer = node(tmp_path)
    order = api.SignalOrder(job_id=7, attempt=0, node="gpu02", signal=10, scope="steps", request_id="r")
    peer.work.signal(order)
    assert peer.steps.calls == [("signal_run", 7, 0, signal.SIGUSR1, False)]
    assert peer.log.bodies() == []


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"{", "malformed order"),
        (encode(api.KillOrder(job_id=1, attempt=0, node="gpu01", reason="cancel")), "delivered to gpu02"),
    ],
    ids=["malformed", "another node's"],
)
async def test_a_bad_order_is_refused_as_invalid_input(tmp_path: Path, data: bytes, error: str) -> None:
    peer = node(tmp_path)
    with pytest.raises(InvalidInput, match=error):
        await peer.work.handle([cast(Msg, SimpleNamespace(data=data))])
    assert peer.log.bodies() == [] and peer.steps.calls == []


async def test_a_job_of_a_user_unknown_on_the_node_runs_nothing_and_says_why(tmp_path: Path) -> None:
    batch = node(tmp_path, "gpu01")
    batch.steps.gone.set()
    await batch.work.launch(launch(job_id=9, user="corral-no-such-user", workdir=str(tmp_path)))
    (exit,) = batch.exits()
    assert exit.launch_error == "Invalid user id: user corral-no-such-user does not exist on gpu01"
    assert not (batch.work.runs.run_dir(9, 0) / "script").exists()  # nothing was run, as anyone


async def test_an_output_file_that_cannot_be_opened_is_reported_naming_it(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    wanted = tmp_path / "afile" / "8.out"
    batch = node(tmp_path, "gpu01")
    await batch.work.launch(launch_order(job_id=8, workdir=str(tmp_path), stdout="afile/%j.out"))
    (exit,) = batch.exits()
    assert exit.launch_error == f"cannot open output file {wanted}: {tmp_path / 'afile'} is not a directory"


async def test_a_run_leaves_no_directory_once_its_exit_is_reported(tmp_path: Path) -> None:
    batch = node(tmp_path, "gpu01")
    batch.steps.gone.set()
    await batch.work.launch(launch_order(job_id=11, workdir=str(tmp_path)))  # its srun is not found: exit 127
    run_dir = batch.work.runs.run_dir(11, 0)
    assert (run_dir / "order.json").exists()  # the job's script and environment, while it runs
    for _ in range(500):
        if batch.exits() and not run_dir.exists():
            break
        await asyncio.sleep(0.01)
    assert [e.exit_code for e in batch.exits()] == [127]
    assert not run_dir.exists()
    # So does a launch that could not start.
    await batch.work.launch(launch_order(job_id=12, workdir=str(tmp_path / "missing")))
    assert not batch.work.runs.run_dir(12, 0).exists()


async def test_a_redelivered_launch_stays_a_no_op_after_a_restart_that_forgot_older_runs(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    batch = node(tmp_path, "gpu01", clock)
    batch.steps.gone.set()
    # (launches that fail at once: no process to wait for)
    old, recent = (launch_order(job_id=j, workdir=str(tmp_path / "missing")) for j in (11, 12))
    await batch.work.launch(old)
    clock.advance(RETENTION_S - 60.0)
    await batch.work.launch(recent)
    await batch.work.kill(api.KillOrder(job_id=7, attempt=2, node="gpu01", reason="requeue"))
    await settle()
    assert sorted((e.job_id, e.attempt) for e in batch.exits()) == [(7, 2), (11, 0), (12, 0)]
    clock.advance(120.0)  # job 11's run ended past the retention; the others not
    restarted = node(tmp_path, "gpu01", clock)
    restarted.steps.gone.set()
    await restarted.work.reconcile()
    records = restarted.work.runs.records
    assert sorted(records.runs) == [(7, 2), (12, 0)]
    assert len((tmp_path / "runs.jsonl").read_bytes().splitlines()) == 2  # compacted at start
    # Job 12's order delivered again (an agent that died before acking it, a consumer recreated): nothing.
    await restarted.work.launch(recent)
    # A launch of an attempt older than one seen here is still refused.
    await restarted.work.launch(launch_order(job_id=7, attempt=1, workdir=str(tmp_path)))
    await settle()
    assert [(e.job_id, e.attempt, e.launch_error) for e in restarted.exits()] == [(7, 1, STALE_ATTEMPT)]
    assert not [b for b in restarted.log.bodies() if isinstance(b, ev.RunStarted)]


async def test_a_run_ended_past_its_retention_while_the_agent_was_down_still_loses_its_directory(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    runs = node(tmp_path, "gpu01", clock).work.runs
    await runs.records.record(Record(job_id=5, attempt=0))
    runs.records.ended(5, 0)  # an agent died before removing its directory, and stayed down
    (runs.make_run_dir(5, 0) / "order.json").write_text("{}")
    clock.advance(RETENTION_S)
    restarted = node(tmp_path, "gpu01", clock)
    await restarted.work.reconcile()
    assert not restarted.work.runs.run_dir(5, 0).exists()  # swept before its record was forgotten
    assert restarted.work.runs.records.get(5, 0) is None


def test_at_start_the_directories_of_runs_reported_ended_go_and_the_others_stay(tmp_path: Path) -> None:
    runs = Runs(tmp_path, confine.RunCgroups(None, "test", cluster_config(nodes=1).node("gpu01"), None))
    runs.records.put(Record(job_id=5, attempt=0, exited=True))  # an agent died before removing its dir
    runs.records.put(Record(job_id=6, attempt=0))  # still running: the adoption reads its pids
    for job_id in (5, 6, 7):  # 7: no record (a launch cut short before it)
        (runs.make_run_dir(job_id, 0) / "pids").write_text("{}")
    (runs.jobs_dir() / "notes").mkdir()
    runs.sweep_run_dirs()
    assert sorted(p.name for p in runs.jobs_dir().iterdir()) == ["6.0", "7.0", "notes"]


def test_the_run_directories_are_traversable_and_a_closed_directory_above_them_is_named() -> None:
    top = Path(tempfile.mkdtemp(prefix="corral-runs-"))  # under /tmp, which everyone may traverse
    try:
        top.chmod(0o711)
        closed = top / "closed"
        closed.mkdir(mode=0o700)
        runs = Runs(
            closed / "agent", confine.RunCgroups(None, "test", cluster_config(nodes=1).node("gpu01"), None)
        )
        assert runs.closed_to_users() == closed  # a job owner could not reach their script
        run_dir = runs.make_run_dir(7, 0)
        assert [p.stat().st_mode & 0o777 for p in (run_dir.parent, run_dir)] == [0o711, 0o711]
        closed.chmod(0o711)
        (closed / "agent").chmod(0o755)
        assert runs.closed_to_users() is None
    finally:
        shutil.rmtree(top)


async def test_a_job_costs_its_node_one_fsync_the_launchs_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The supervisor's pid and the two reports are written before the agent goes on, but not fsynced:
    # lost with the machine, they only repeat a harmless step (records.py, "Durability").
    synced: list[int] = []
    fsync = records.timed_fsync

    def counted(fd: int) -> float:
        synced.append(fd)
        return fsync(fd)

    monkeypatch.setattr(records, "timed_fsync", counted)
    batch = node(tmp_path, "gpu01")
    batch.steps.gone.set()
    await batch.work.launch(launch_order(job_id=11, workdir=str(tmp_path)))  # its srun is not found: exit 127
    for _ in range(500):
        if batch.exits() and not batch.work.runs.run_dir(11, 0).exists():
            break
        await asyncio.sleep(0.01)
    assert [e.exit_code for e in batch.exits()] == [127]
    rec = batch.work.runs.records.get(11, 0)
    assert rec is not None and (rec.supervisor > 0, rec.start_reported, rec.exited) == (True, True, True)
    assert len(synced) == 1, synced  # the launch's line, before the supervisor started
    # What the file says is what the agent knows, though three of its four lines were never fsynced.
    assert Records(batch.work.runs.records.path).get(11, 0) == rec
