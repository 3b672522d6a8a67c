"""sacct --json and -l: Slurm's JSON shape for the fields Corral records; the long field list."""

from __future__ import annotations

import json

import pytest

from corral.cli import sacct
from corral.cli.sacct_json import acct_json
from corral.schemas.api import AcctAttempt, AcctJob, AcctStep

pytestmark = pytest.mark.unit

T = 1_700_000_000.0


def record(**fields: object) -> AcctJob:
    """Job 7, completed on gpu01 after 30 s, with its batch step."""
    base: dict[str, object] = dict(
        job_id=7, name="train", user="alice", account="ml", partition="gpu", state="COMPLETED",
        cancelled_by=None, exit_code=0, signal=0, submit_time=T, start_time=T + 10, end_time=T + 40,
        time_limit_s=3600, num_nodes=1, num_cpus=2, num_gpus=1, node_list="gpu01", restart_count=0,
        workdir="/home/alice", reason="None",
        steps=[AcctStep(step="batch", name="batch", state="COMPLETED", exit_code=0, signal=0,
                        start_time=T + 10, end_time=T + 40, node_list="gpu01", num_cpus=2, num_tasks=1,
                        num_gpus=1)],
    )  # fmt: skip
    base.update(fields)
    return AcctJob(**base)  # type: ignore[arg-type]


def test_sacct_json_shape() -> None:
    doc = json.loads(acct_json([record()], now=T + 100))
    job = doc["jobs"][0]
    assert (job["job_id"], job["name"], job["state"]["current"]) == (7, "train", ["COMPLETED"])
    assert job["exit_code"]["status"] == ["SUCCESS"]
    assert job["exit_code"]["return_code"] == {"set": True, "infinite": False, "number": 0}
    assert job["time"]["elapsed"] == 30 and job["time"]["limit"]["number"] == 60
    assert job["array"]["task_id"]["set"] is False
    assert [s["step"]["id"] for s in job["steps"]] == ["7.batch"]
    assert doc["errors"] == [] and doc["meta"]["plugin"]["data_parser"] == "data_parser/v0.0.40"


@pytest.mark.parametrize(
    ("fields", "status", "code", "signal"),
    [
        ({"exit_code": 3, "state": "FAILED"}, ["ERROR"], 3, False),
        ({"signal": 9, "state": "CANCELLED"}, ["SIGNALED"], 0, True),
    ],
    ids=["failed", "signalled"],
)
def test_sacct_json_exit_codes(fields: dict[str, object], status: list[str], code: int, signal: bool) -> None:
    job = json.loads(acct_json([record(**fields)], now=T + 100))["jobs"][0]
    assert job["exit_code"]["status"] == status
    assert job["exit_code"]["return_code"]["number"] == code
    assert job["exit_code"]["signal"]["id"]["set"] is signal


def test_sacct_json_of_a_running_array_task_without_steps() -> None:
    running = record(state="RUNNING", end_time=None, array_job_id=5, array_task_id=2, time_limit_s=None)
    job = json.loads(acct_json([running], now=T + 70, steps=False))["jobs"][0]
    assert job["time"]["elapsed"] == 60 and job["time"]["end"] == 0
    assert job["time"]["limit"] == {"set": False, "infinite": True, "number": 0}
    assert (job["array"]["job_id"], job["array"]["task_id"]["number"]) == (5, 2)
    assert job["steps"] == []


def test_sacct_long_and_json_options() -> None:
    args = sacct.parse_args(["-l", "--json"])
    assert args.json
    assert [c.title for c in args.columns] == sacct.LONG_FIELDS.split(",")


def test_sacct_json_with_duplicates_has_a_record_per_run() -> None:
    # -D: the earlier run (requeued after a node failure) is a job record of its own, before the job's.
    first = AcctAttempt(
        attempt=0, state="NODE_FAIL", partition="gpu", start_time=T + 1, end_time=T + 5, node_list="gpu02",
        num_nodes=1, num_cpus=2, num_gpus=1, mem_mb=0, exit_code=0, signal=0, reason="NodeFail",
    )  # fmt: skip
    doc = json.loads(acct_json([record(restart_count=1, attempts=[first])], now=T + 100))
    runs = [(j["job_id"], j["state"]["current"], j["restart_cnt"], j["nodes"]) for j in doc["jobs"]]
    assert runs == [(7, ["NODE_FAIL"], 0, "gpu02"), (7, ["COMPLETED"], 1, "gpu01")]
