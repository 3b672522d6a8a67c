"""The agent's run records forget what no order can come for any more, and their file is compacted
(``services/agent/records.py``): a record is kept while its run is unfinished and for a retention after its
exit was reported; the file is rewritten as one line per kept record at start and whenever it has grown to
a multiple of them, through a temporary file renamed over it, so a crash leaves one whole file or the other.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from corral.libs.runtime.clock import FakeClock
from corral.services.agent.crashpoints import CRASH_EXIT
from corral.services.agent.records import COMPACT_FACTOR, Record, Records

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

#: A retention short enough to count in seconds of the fake clock.
WINDOW = 100.0
ROOT = Path(__file__).resolve().parents[2]


def records(path: Path, clock: FakeClock, **options: int) -> Records:
    return Records(path, clock=clock, retention_s=WINDOW, **options)


def lines(path: Path) -> list[Record]:
    return [msgspec.json.decode(line, type=Record) for line in path.read_bytes().splitlines()]


async def run_and_end(recs: Records, job_id: int, attempt: int = 0) -> None:
    """A run's four facts: launch decided, supervisor started, start reported, exit reported."""
    await recs.record(Record(job_id=job_id, attempt=attempt, start_reported=False))
    recs.note(job_id, attempt, pid=1000 + job_id, supervisor=2000 + job_id)
    recs.note(job_id, attempt, start_reported=True)
    recs.ended(job_id, attempt)


async def ten_runs_ended_a_second_apart(path: Path, clock: FakeClock) -> Records:
    """Jobs 1..10 reported ended at t0, t0+1, ..., t0+9, and job 99 still running; the clock at t0+10."""
    recs = records(path, clock)
    for job_id in range(1, 11):
        await run_and_end(recs, job_id)
        clock.advance(1.0)
    recs.put(Record(job_id=99, attempt=0, pid=7))
    return recs


async def test_the_runs_ended_past_the_retention_are_forgotten_at_start(tmp_path: Path) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    await ten_runs_ended_a_second_apart(path, clock)
    assert len(lines(path)) == 41  # four lines a run, one for the running one
    clock.advance(WINDOW - 5.0)  # t0+105: the runs ended at t0..t0+5 are past the retention
    restarted = records(path, clock)
    assert len(restarted.runs) == 11  # (read whole: the start's sweeps look at the ended runs first)
    assert restarted.compact() == 6
    kept = [7, 8, 9, 10, 99]
    assert sorted(job_id for job_id, _ in restarted.runs) == kept
    assert sorted(r.job_id for r in lines(path)) == kept  # one line per kept record
    assert [restarted.latest_attempt(j) for j in (1, 6, 7, 99)] == [-1, -1, 0, 0]
    assert [r.job_id for r in restarted.unfinished()] == [99]
    # What the next start reads is what this one kept, and the file takes new lines after its rewrite.
    await run_and_end(restarted, 11)
    assert records(path, clock).runs == restarted.runs


async def test_a_run_is_kept_for_the_whole_retention_after_its_exit_whatever_its_age(tmp_path: Path) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    recs = records(path, clock)
    recs.put(Record(job_id=1, attempt=0, pid=7))
    clock.advance(10 * WINDOW)  # a long run: its age does not count, only the time since its exit
    assert recs.compact() == 0
    recs.ended(1, 0)
    clock.advance(WINDOW - 0.5)
    assert recs.compact() == 0 and recs.get(1, 0) is not None
    clock.advance(0.5)
    assert recs.compact() == 1 and recs.get(1, 0) is None and lines(path) == []


def test_a_record_written_before_exit_times_were_kept_counts_from_the_first_compaction(
    tmp_path: Path,
) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    path.write_bytes(b'{"job_id":3,"attempt":0,"pid":7,"exited":true}\n')
    recs = records(path, clock)
    assert recs.compact() == 0  # its exit's time is unknown: the retention starts now
    assert lines(path) == [Record(job_id=3, attempt=0, pid=7, exited=True, exited_at=clock.now())]
    clock.advance(WINDOW)
    assert records(path, clock).compact() == 1


async def test_a_long_running_agent_compacts_its_file_as_it_grows(tmp_path: Path) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    recs = records(path, clock, compact_min_lines=20)
    recs.compact()  # the start's
    window = 10.0
    recs.retention_s = window
    most_lines = 0
    for job_id in range(1, 201):  # 200 runs a second apart: ten inside the retention at any time
        await run_and_end(recs, job_id)
        clock.advance(1.0)
        most_lines = max(most_lines, len(path.read_bytes().splitlines()))
    # Before: 800 lines and 200 records. Now bounded by the runs inside the retention, not by all runs.
    assert most_lines <= COMPACT_FACTOR * (window + 5), most_lines
    assert len(recs.runs) <= (COMPACT_FACTOR + 1) * window, len(recs.runs)
    assert records(path, clock).runs == recs.runs


async def test_a_compaction_amid_group_commits_loses_no_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    recs = records(path, clock, compact_min_lines=8)
    recs.compact()
    for job_id in range(1, 41):
        await run_and_end(recs, job_id)
    clock.advance(WINDOW)  # the first forty are past the retention
    fsync = os.fsync

    def slow(fd: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            time.sleep(0.005)  # a slow disk: the lines written meanwhile wait for the next fsync
        fsync(fd)

    monkeypatch.setattr(os, "fsync", slow)
    recs._quick = False  # (the disk was found slow: fsyncs go to the worker thread, grouped)
    await asyncio.gather(*(run_and_end(recs, job_id) for job_id in range(41, 81)))
    # A compaction came between the fsyncs in the thread: it forgot the first forty, and lost no line.
    assert sorted(recs.runs) == [(job_id, 0) for job_id in range(41, 81)]
    assert all(r.exited for r in recs.runs.values())
    assert records(path, clock).runs == recs.runs


CHILD = """
import sys
from pathlib import Path
from corral.libs.runtime.clock import FakeClock
from corral.services.agent.crashpoints import CrashPoints
from corral.services.agent.records import Records

path, point, now = sys.argv[1:]
clock, crash = FakeClock(now=float(now)), CrashPoints(point).reached
Records(Path(path), clock=clock, retention_s=100.0, crash=crash).compact()
"""


def compact_and_die(path: Path, clock: FakeClock, point: str) -> None:
    """Compact ``path`` in an agent-like process armed to die at ``point`` (as SIGKILL would: no cleanup)."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), point, str(clock.now())],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == CRASH_EXIT, child.stderr.decode()


@pytest.mark.parametrize(
    ("point", "whole"),
    [("records.compact_written", "old"), ("records.compact_renamed", "new")],
    ids=["written-not-renamed", "renamed-dir-not-synced"],
)
async def test_a_crash_in_a_compaction_leaves_one_whole_file(tmp_path: Path, point: str, whole: str) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    before = await ten_runs_ended_a_second_apart(path, clock)
    clock.advance(WINDOW - 5.0)
    old = path.read_bytes()
    compact_and_die(path, clock, point)
    restarted = records(path, clock)
    assert not path.with_name("runs.jsonl.tmp").exists()  # a temporary file left behind is removed
    if whole == "old":
        assert path.read_bytes() == old and restarted.runs == before.runs
    else:
        assert sorted(job_id for job_id, _ in restarted.runs) == [7, 8, 9, 10, 99]
    restarted.compact()
    assert sorted(job_id for job_id, _ in records(path, clock).runs) == [7, 8, 9, 10, 99]


async def test_a_half_written_temporary_file_is_ignored_and_removed(tmp_path: Path) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    before = await ten_runs_ended_a_second_apart(path, clock)
    old = path.read_bytes()
    tmp = path.with_name("runs.jsonl.tmp")
    tmp.write_bytes(old[: len(old) // 3])  # a compaction cut short mid-write
    restarted = records(path, clock)
    assert not tmp.exists() and path.read_bytes() == old and restarted.runs == before.runs


async def test_a_compaction_that_fails_leaves_the_file_and_the_records_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, clock = tmp_path / "runs.jsonl", FakeClock()
    recs = await ten_runs_ended_a_second_apart(path, clock)
    clock.advance(WINDOW)
    before, old = dict(recs.runs), path.read_bytes()

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        recs.compact()
    assert recs.runs == before and path.read_bytes() == old
    assert not path.with_name("runs.jsonl.tmp").exists()
    recs.put(Record(job_id=100, attempt=0))  # the file still takes lines
    assert records(path, clock).runs == recs.runs
