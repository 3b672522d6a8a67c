"""The agent's pure parts: --signal, deadline arithmetic, status files, records, base environment, GPU
inventory and node drain."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import msgspec
import pytest
from builders import T0, Log, allocated, cluster_config, job, registered, submitted
from test_jobenv import launch
from test_sbatch_args import sbatch_error, submit, with_directives

from corral.libs.core.placement import free_capacity
from corral.schemas import events as ev
from corral.services.agent import runner
from corral.services.agent.inventory import inventory
from corral.services.agent.jobenv import base_environment, job_environment
from corral.services.agent.records import Record, Records
from corral.services.scheduler.views import node_state

pytestmark = pytest.mark.unit

USR1, USR2, TERM = int(signal.SIGUSR1), int(signal.SIGUSR2), int(signal.SIGTERM)


# --- sbatch --signal ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("USR1@30", ev.WarnSignal(signum=USR1, seconds_before=30)),
        ("B:USR1@30", ev.WarnSignal(signum=USR1, seconds_before=30, batch_only=True)),
        ("SIGUSR2", ev.WarnSignal(signum=USR2, seconds_before=60)),
        ("R:TERM@120", ev.WarnSignal(signum=TERM, seconds_before=120)),
        ("10@0", ev.WarnSignal(signum=10, seconds_before=0)),
    ],
)
def test_sbatch_signal_option(value: str, expected: ev.WarnSignal) -> None:
    assert submit([f"--signal={value}", "s.sh"]).spec.warn_signal == expected


def test_sbatch_signal_directive_and_command_line_override() -> None:
    script = with_directives("#SBATCH --signal=B:USR1@90")
    assert submit(["s.sh"], script).spec.warn_signal == ev.WarnSignal(
        signum=USR1, seconds_before=90, batch_only=True
    )
    assert submit(["--signal=USR2@5", "s.sh"], script).spec.warn_signal == ev.WarnSignal(
        signum=USR2, seconds_before=5
    )
    assert submit(["s.sh"]).spec.warn_signal is None


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("FOO@9", 'sbatch: error: invalid --signal "FOO@9": use [{R|B}:]SIG[@SECONDS]'),
        ("X:USR1", 'sbatch: error: invalid --signal "X:USR1": use [{R|B}:]SIG[@SECONDS]'),
        ("USR1@x", 'sbatch: error: invalid --signal "USR1@x": give @SECONDS as a whole number'),
        ("USR1@70000", 'sbatch: error: invalid --signal "USR1@70000": give @SECONDS as a whole number'),
    ],
)
def test_sbatch_bad_signal_is_refused(value: str, line: str) -> None:
    assert sbatch_error([f"--signal={value}", "s.sh"]).startswith(line)


# --- deadline arithmetic -----------------------------------------------------------------------------
def rec(**fields: object) -> Record:
    """A run record started at T0."""
    base: dict[str, object] = {"job_id": 1, "attempt": 0, "pid": 100, "started_at": T0}
    base.update(fields)
    return Record(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "warn", "wake"),
    [
        (rec(), None, None),  # unlimited, no signal
        (rec(deadline=T0 + 60), None, T0 + 60),  # limit only
        (rec(deadline=T0 + 60, warn_signal=USR1, warn_before_s=20), T0 + 40, T0 + 40),
        (rec(deadline=T0 + 60, warn_signal=USR1, warn_before_s=20, warned=True), None, T0 + 60),
        (rec(deadline=T0 + 60, warn_signal=USR1, warn_before_s=90), T0, T0),  # T beyond the limit: at once
        (rec(deadline=T0 + 60, ending="timed_out"), None, None),  # killing: nothing more to time
        (rec(deadline=T0 + 60, warn_signal=USR1, warn_before_s=20, ending="killed"), T0 + 40, T0 + 40),
        (rec(warn_signal=USR1, warn_before_s=20), None, None),  # no limit: no warning
    ],
)
def test_warning_and_deadline_times(record: Record, warn: float | None, wake: float | None) -> None:
    assert runner.warn_at(record) == warn
    assert runner.next_wakeup(record) == wake


def test_deadline_of() -> None:
    assert runner.deadline_of(T0, None) is None
    assert runner.deadline_of(T0, 20) == T0 + 20


# --- status files ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "ending", "expected"),
    [
        ({"exit_code": 0, "signal": 0, "oom": False}, "", runner.Outcome(0, 0, False, False)),
        ({"exit_code": 3, "signal": 0, "oom": False}, "", runner.Outcome(3, 0, False, False)),
        ({"exit_code": 0, "signal": 9, "oom": True}, "", runner.Outcome(0, 9, False, False, oom=True)),
        ({"exit_code": 0, "signal": 15, "oom": False}, "timed_out", runner.Outcome(0, 15, True, False)),
        ({"exit_code": 0, "signal": 15, "oom": False}, "killed", runner.Outcome(0, 15, False, True)),
        ({"exit_code": 143}, "", runner.Outcome(143, 0, False, False)),
    ],
)
def test_status_file_decoding(status: dict[str, object], ending: str, expected: runner.Outcome) -> None:
    assert runner.decode_status(json.dumps(status).encode(), rec(ending=ending)) == expected


@pytest.mark.parametrize(
    ("ending", "expected"),
    [
        ("", runner.Outcome(0, 9, False, True)),  # lost without a status: killed (requeued as NODE_FAIL)
        ("killed", runner.Outcome(0, 9, False, True)),
        ("timed_out", runner.Outcome(0, 9, True, False)),
    ],
)
def test_a_vanished_supervisor_is_reported_killed(ending: str, expected: runner.Outcome) -> None:
    assert runner.vanished(rec(ending=ending)) == expected


def test_pids_file(tmp_path: Path) -> None:
    assert runner.read_pids(tmp_path) is None
    # the batch step's supervisor writes its pids as every step's: itself, then each task (the script: 0)
    (tmp_path / "pids").write_text('{"stepd": [10, 12345], "tasks": {"0": [11, 12346]}}')
    assert runner.read_pids(tmp_path) == (10, 12345, 11)
    (tmp_path / "pids").write_text('{"stepd": [10, 12345], "tasks": {}}')  # before the script started
    assert runner.read_pids(tmp_path) is None
    (tmp_path / "pids").write_text('{"stepd": [10')
    assert runner.read_pids(tmp_path) is None


# --- records -----------------------------------------------------------------------------------------
def test_records_are_append_only_and_survive_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    records = Records(path)
    records.put(Record(job_id=1, attempt=0))
    records.update(1, 0, pid=42, supervisor=41, deadline=T0 + 60)
    records.update(1, 0, warned=True)
    records.put(Record(job_id=2, attempt=1))
    lines = path.read_bytes().splitlines()
    assert len(lines) == 4
    with open(path, "ab") as fh:
        fh.write(b'{"job_id":2,"attempt":1,"pi')  # a crash in the middle of a write
    again = Records(path)
    assert again.get(1, 0) == Record(
        job_id=1, attempt=0, pid=42, supervisor=41, deadline=T0 + 60, warned=True
    )
    assert again.get(2, 1) == Record(job_id=2, attempt=1)
    assert again.latest_attempt(2) == 1
    assert [r.job_id for r in again.unfinished()] == [1, 2]


def test_a_record_after_a_torn_line_is_a_line_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b'{"job_id":1,"attempt":0}\n{"job_id":2,"attempt":0,"pi')  # a crash mid-write
    Records(path).put(Record(job_id=3, attempt=0))
    again = Records(path)
    assert again.get(1, 0) is not None and again.get(2, 0) is None and again.get(3, 0) is not None


def test_a_short_write_is_finished_before_the_record_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs.jsonl"
    records = Records(path)
    write = os.write

    def short(fd: int, data: bytes) -> int:  # a nearly full disk takes half of what it is given
        return write(fd, bytes(data[: max(1, len(data) // 2)]))

    monkeypatch.setattr(os, "write", short)
    records.put(Record(job_id=4, attempt=0, pid=77))
    monkeypatch.undo()
    assert Records(path).get(4, 0) == Record(job_id=4, attempt=0, pid=77)


async def test_concurrent_records_share_fsyncs_and_keep_their_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runs.jsonl"
    records = Records(path)
    in_place: list[bool] = []  # each fsync: in the event loop's thread?
    fsync = os.fsync

    def slow(fd: int) -> None:
        in_place.append(threading.current_thread() is threading.main_thread())
        time.sleep(0.01)  # a slow disk's fsync: the others' lines pile up meanwhile
        fsync(fd)

    monkeypatch.setattr(os, "fsync", slow)
    await asyncio.gather(*(records.record(Record(job_id=j, attempt=0)) for j in range(1, 21)))
    # The first in place (it found the disk slow), then in the worker thread: twenty lines, a few fsyncs.
    assert in_place[0] and not any(in_place[1:]) and 2 <= len(in_place) <= 4, in_place
    lines = path.read_bytes().splitlines()
    assert [msgspec.json.decode(line, type=Record).job_id for line in lines] == list(range(1, 21))
    changed = records.note(20, 0, exited=True)  # (written, not waited for: the next fsync covers it)
    assert changed.exited and Records(path).get(20, 0) == changed
    assert records.latest_attempt(20) == 0


def test_the_latest_attempt_is_the_highest_recorded_whatever_the_order(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    records = Records(path)
    assert records.latest_attempt(7) == -1
    records.put(Record(job_id=7, attempt=2))
    records.put(Record(job_id=7, attempt=0))  # an older run's late fact
    records.update(7, 0, exited=True)
    records.put(Record(job_id=8, attempt=0))
    assert (records.latest_attempt(7), records.latest_attempt(8), records.latest_attempt(9)) == (2, 0, -1)
    again = Records(path)
    assert (again.latest_attempt(7), again.latest_attempt(8)) == (2, 0)


def test_old_record_lines_still_decode(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b'{"job_id":3,"attempt":0,"pid":7,"exited":true}\n')
    assert Records(path).get(3, 0) == Record(job_id=3, attempt=0, pid=7, exited=True)
    # written before start_reported existed: its RunStarted went out with it (a restart must not repeat it)
    assert Records(path).get(3, 0).start_reported  # type: ignore[union-attr]


# --- environment -------------------------------------------------------------------------------------
AGENT_ENV = {
    "CORRAL_STATE_DIR": "/var/lib/corral",
    "CORRAL_CREDENTIALS": "/etc/corral/agent.json",
    "PATH": "/opt/agent/bin",
    "AGENT_SECRET": "x",
    "SLURM_JOB_ID": "9",
}


def test_base_environment_is_the_login_basics_and_where_the_cluster_is() -> None:
    assert base_environment(AGENT_ENV, "alice", "/home/alice", "/bin/bash") == {
        "HOME": "/home/alice",
        "USER": "alice",
        "LOGNAME": "alice",
        "SHELL": "/bin/bash",
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "CORRAL_STATE_DIR": "/var/lib/corral",
    }


@pytest.mark.parametrize(
    ("export", "present", "absent"),
    [
        (
            "NONE",
            {"HOME": "/home/alice", "SLURM_JOB_ID": "4242"},
            ["AGENT_SECRET", "CORRAL_CREDENTIALS", "A"],
        ),
        ("NONE,A", {"A": "1", "PATH": "/usr/local/bin:/usr/bin:/bin"}, ["B", "AGENT_SECRET"]),
        ("ALL", {"A": "1", "B": "2", "PATH": "/home/alice/venv/bin"}, ["AGENT_SECRET"]),
        ("A=5", {"A": "5"}, ["B", "CORRAL_CREDENTIALS"]),  # no ALL: only what is named (Slurm)
    ],
)
def test_export_reaches_the_job_without_the_agents_environment(
    export: str, present: dict[str, str], absent: list[str]
) -> None:
    submitter = {
        "A": "1",
        "B": "2",
        "PATH": "/home/alice/venv/bin",
        "SLURM_JOB_ID": "77",
        "SLURM_PROCID": "3",
    }
    spec = submit([f"--export={export}", "s.sh"], env=submitter).spec
    order = launch(environment=spec.environment)
    env = job_environment(order, base_environment(AGENT_ENV, "alice", "/home/alice", "/bin/bash"), 1000, 1000)
    for name, value in present.items():
        assert env[name] == value
    for name in absent:
        assert name not in env
    assert env["SLURM_PROCID"] == "0"  # the job's own identity, never its submitter's


# --- GPU inventory -----------------------------------------------------------------------------------
NODE = cluster_config(nodes=1, gpus=4).nodes[0]


@pytest.mark.parametrize(
    ("found", "gpus", "reason"),
    [
        (None, 4, ""),  # no NVML or no driver: the configuration
        ((4, "NVIDIA H100"), 4, ""),
        ((3, "NVIDIA H100"), 4, "gres/gpu count reported lower than configured (3 != 4)"),
        ((0, None), 4, "gres/gpu count reported lower than configured (0 != 4)"),
        ((8, "NVIDIA H100"), 4, "gres/gpu count reported higher than configured (8 != 4)"),
    ],
)
def test_gpu_count_mismatch_drains(found: tuple[int, str | None] | None, gpus: int, reason: str) -> None:
    got = inventory(NODE, lambda: found)
    assert (got.gpus, got.drain_reason) == (gpus, reason)


# --- drain in the core -------------------------------------------------------------------------------
def drained(name: str, reason: str) -> ev.NodeRegistered:
    """A registration with a drain reason."""
    return msgspec.structs.replace(registered(name, gpus=8), drain_reason=reason)


def test_a_drained_node_has_no_free_capacity_and_shows_drain() -> None:
    log = Log()
    state = log.add(registered("gpu01"), drained("gpu02", "gres/gpu count reported lower"))
    assert state.nodes["gpu02"].drain == "gres/gpu count reported lower"
    assert sorted(free_capacity(state.nodes)) == ["gpu01"]
    assert node_state(state.nodes["gpu02"]) == "drained"
    # A later clean registration resumes it.
    state = log.add(registered("gpu02"))
    assert state.nodes["gpu02"].drain == ""
    assert sorted(free_capacity(state.nodes)) == ["gpu01", "gpu02"]


def test_a_node_drained_under_a_running_job_is_draining() -> None:
    log = Log()
    log.add(registered("gpu01"), submitted(1, job(nodes=1, gpus=2)), allocated(1, {"gpu01": [0, 1]}))
    state = log.add(drained("gpu01", "bad gpu"))
    assert node_state(state.nodes["gpu01"]) == "draining"
    assert state.jobs[1].state == "RUNNING"
    assert free_capacity(state.nodes) == {}
