"""What-if replay: an exported event log becomes a simulator workload and the real schedule to compare."""

from __future__ import annotations

import pytest
from builders import T0, Log, allocated, cluster, exited, job, submitted

from corral.libs.sim.engine import JobRecord, SimResult, simulate
from corral.libs.sim.eventlog import encode_line, log_cluster, log_workload, looks_like_log, parse_log
from corral.libs.sim.report import format_comparison, metrics
from corral.libs.sim.workload import WorkloadError
from corral.schemas import events as ev

pytestmark = pytest.mark.unit


def history() -> Log:
    """Two 8-GPU nodes; a job, a 3-task array (one task cancelled while pending), a requeued job, a
    job that never starts and one still running when the log ends."""
    log = Log(*cluster(nodes=2, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=600, partition="gpu")), step=10.0)  # t0+11
    log.add(allocated(1, {"gpu01": list(range(8))}), step=1.0)  # starts at t0+12
    log.add(exited(1, "gpu01"), step=100.0)
    log.add(ev.JobCompleted(job_id=1, attempt=0), step=1.0)  # ends at t0+113
    array = job(gpus=4, nodes=1, partition="gpu", array=ev.ArraySpec(ranges=[ev.ArrayRange(start=0, end=2)]))
    log.add(submitted(2, array, user="bob"), step=1.0)  # tasks 2, 3, 4 at t0+114
    log.add(allocated(2, {"gpu02": [0, 1, 2, 3]}), step=1.0)
    log.add(allocated(3, {"gpu02": [4, 5, 6, 7]}), step=0.0)
    log.add(ev.JobCancelRequested(job_id=4, user="bob"), step=1.0)
    log.add(ev.JobCancelled(job_id=4, attempt=-1, by="bob", signal=0), step=0.0)
    log.add(exited(2, "gpu02", exit_code=3), step=50.0)
    log.add(ev.JobFailed(job_id=2, attempt=0, reason="NonZeroExitCode", exit_code=3), step=0.0)
    log.add(exited(3, "gpu02"), step=10.0)
    log.add(ev.JobCompleted(job_id=3, attempt=0), step=0.0)
    log.add(submitted(5, job(gpus=2, nodes=1, partition="gpu")), step=1.0)
    log.add(allocated(5, {"gpu01": [0, 1]}), step=1.0)
    log.add(ev.JobRequeued(job_id=5, attempt=0, reason="Requested"), step=30.0)
    log.add(allocated(5, {"gpu02": [6, 7]}, attempt=1), step=5.0)  # the last run: 20 s
    log.add(exited(5, "gpu02", attempt=1), step=20.0)
    log.add(ev.JobCompleted(job_id=5, attempt=1), step=0.0)
    log.add(submitted(6, job(gpus=8, nodes=2, partition="gpu", held=True)), step=1.0)
    log.add(submitted(7, job(gpus=1, nodes=1, partition="gpu")), step=1.0)
    log.add(allocated(7, {"gpu01": [0]}), step=1.0)
    return log


def test_the_log_becomes_the_jobs_that_ran_and_ended_with_their_last_runs() -> None:
    log = history()
    workload = log_workload(log.entries)
    by_id = {j.id: j for j in workload.jobs}
    assert list(by_id) == [1, 2, 3, 5]
    assert workload.skipped == 3  # 4 cancelled while pending, 6 never ran, 7 still running
    assert [(j.submit - T0, j.run_time, j.units, j.user) for j in workload.jobs] == [
        (11.0, 101.0, 8, "alice"),
        (114.0, 51.0, 4, "bob"),
        (114.0, 61.0, 4, "bob"),
        (177.0, 20.0, 2, "alice"),
    ]
    # An array task is a job of its own; the workflow (array, holds, dependencies) is not replayed.
    assert by_id[3].spec is not None and by_id[3].spec.array is None
    assert by_id[1].req_time == 600 and by_id[2].req_time is None
    assert [(r.id, r.start - r.submit, r.end - r.start, r.nodes, r.state) for r in workload.actual] == [
        (1, 1.0, 101.0, ("gpu01",), "COMPLETED"),
        (2, 1.0, 51.0, ("gpu02",), "FAILED"),
        (3, 1.0, 61.0, ("gpu02",), "COMPLETED"),
        (5, 36.0, 20.0, ("gpu02",), "COMPLETED"),
    ]
    assert [n.node for n in workload.nodes] == ["gpu01", "gpu02"]


def test_export_lines_round_trip_and_a_bad_line_names_the_file_and_line() -> None:
    log = history()
    data = b"".join(encode_line(seq, envelope) for seq, envelope in log.entries)
    assert parse_log(data, "x.jsonl") == log.entries
    assert looks_like_log(data[:10], "x.txt") and not looks_like_log(b"id,submit", "x.csv")
    with pytest.raises(WorkloadError, match=r"^x\.jsonl:2: not a log entry"):
        parse_log(data.splitlines()[0] + b"\n{}\n", "x.jsonl")
    with pytest.raises(WorkloadError, match="out of order"):
        parse_log(b"\n".join(reversed(data.splitlines()[:2])), "x.jsonl")


@pytest.mark.parametrize(
    ("backfill", "waits"),
    [
        # The replay starts every job as soon as its GPUs are free: no launch latency, no requeue.
        ("fifo", {1: 0.0, 2: 0.0, 3: 0.0, 5: 0.0}),
        ("easy", {1: 0.0, 2: 0.0, 3: 0.0, 5: 0.0}),
    ],
)
def test_the_workload_replays_on_the_logs_own_nodes(backfill: str, waits: dict[int, float]) -> None:
    workload = log_workload(history().entries)
    cluster_ = log_cluster(workload.nodes)
    assert (cluster_.capacity, [p.name for p in cluster_.partitions]) == (16, ["gpu"])
    result = simulate(workload.jobs, cluster_, backfill)  # type: ignore[arg-type]
    assert {r.id: r.start - r.submit for r in result.records} == waits
    assert {r.id: r.end - r.start for r in result.records} == {1: 101.0, 2: 51.0, 3: 61.0, 5: 20.0}
    actual = metrics(SimResult(workload.actual, cluster_.capacity, 0))
    assert actual.max_wait == 36.0 and metrics(result).max_wait == 0.0


def test_a_busier_replay_shows_easy_backfilling_what_fifo_keeps_waiting() -> None:
    """One 8-GPU node: a 4-GPU job runs, an 8-GPU job waits for it, then a short 2-GPU job comes."""
    log = Log(*cluster(nodes=1, gpus=8))
    runs = [(1, 4, 200, 100.0), (2, 8, 200, 100.0), (3, 2, 50, 10.0)]
    for job_id, gpus, limit, _ in runs:
        log.add(submitted(job_id, job(gpus=gpus, nodes=1, partition="gpu", time_s=limit)), step=1.0)
    for job_id, gpus, _, run in runs:
        log.add(allocated(job_id, {"gpu01": list(range(gpus))}), step=0.0)
        log.add(exited(job_id, "gpu01"), step=run)
        log.add(ev.JobCompleted(job_id=job_id, attempt=0), step=0.0)
    workload = log_workload(log.entries)
    fifo = simulate(workload.jobs, log_cluster(workload.nodes), "fifo")
    easy = simulate(workload.jobs, log_cluster(workload.nodes), "easy")
    assert {r.id: r.start - r.submit for r in fifo.records} == {1: 0.0, 2: 99.0, 3: 198.0}
    # EASY starts job 3 at once: it ends (limit 50 s) before job 2's reservation at job 1's end.
    assert {r.id: r.start - r.submit for r in easy.records} == {1: 0.0, 2: 99.0, 3: 0.0}
    text = format_comparison([("fifo", metrics(fifo)), ("actual", metrics(SimResult(workload.actual, 8, 0)))])
    assert text.splitlines()[0].split() == ["fifo", "actual"]
    assert text.splitlines()[1].split() == ["jobs", "3", "3"]


def test_records_of_what_happened_carry_the_final_state() -> None:
    workload = log_workload(history().entries)
    assert isinstance(workload.actual[0], JobRecord)
    assert {r.state for r in workload.actual} == {"COMPLETED", "FAILED"}


def test_a_job_that_ran_in_an_advance_reservation_replays_outside_it() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, partition="gpu", reservation="maint")), step=1.0)
    log.add(allocated(1, {"gpu01": list(range(8))}), step=1.0)
    log.add(exited(1, "gpu01"), step=10.0)
    log.add(ev.JobCompleted(job_id=1, attempt=0), step=0.0)
    workload = log_workload(log.entries)
    assert [j.spec.reservation if j.spec else "?" for j in workload.jobs] == [None]
    # The simulated cluster has no reservation: kept, the job would wait forever.
    result = simulate(workload.jobs, log_cluster(workload.nodes), "easy")
    assert [r.state for r in result.records] == ["COMPLETED"]
