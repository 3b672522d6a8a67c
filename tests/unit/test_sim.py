"""The simulator on small hand-built workloads: FIFO, EASY and conservative, metrics, the command."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from corral.cli.corral_cmd import main as corral_main
from corral.cli.sim import main as sim_main
from corral.libs.config.cluster import parse_config
from corral.libs.sim.engine import SimError, config_cluster, simulate, unit_cluster
from corral.libs.sim.report import format_metrics, metrics, write_starts
from corral.libs.sim.workload import SimJob

pytestmark = pytest.mark.unit


def job(id: int, submit: int, units: int, run: int, req: int | None = None) -> SimJob:
    """A job of ``units`` processors that runs ``run`` seconds and requests ``req`` (default: run)."""
    return SimJob(id, submit, run, run if req is None else req, units)


# 4 units. 1 holds 3 until 100; 2 (2 units) is blocked and reserved for [100, 200); 3 needs the
# whole machine; 4 (1 unit, 300 s) fits EASY's extra units but would delay 3; 5 is short.
POLICIES = [
    job(1, 0, 3, 100),
    job(2, 1, 2, 100),
    job(3, 2, 4, 10),
    job(4, 3, 1, 300),
    job(5, 4, 1, 50),
]
EXPECTED_STARTS = {
    # The blocked job 3 holds everything behind it.
    "fifo": {1: 0, 2: 100, 3: 200, 4: 210, 5: 210},
    # Only the head (2, then 3) is protected: 4 backfills at once and delays 3 to its end at 303.
    "easy": {1: 0, 2: 100, 3: 303, 4: 3, 5: 100},
    # Every waiting job is protected: 4 waits for 3; 5 ends before any reservation and starts now.
    "conservative": {1: 0, 2: 100, 3: 200, 4: 210, 5: 4},
}


@pytest.mark.parametrize("policy", ["fifo", "easy", "conservative"])
def test_policies_differ_as_the_textbook_says(policy: str) -> None:
    result = simulate(POLICIES, unit_cluster(4), policy)  # type: ignore[arg-type]
    assert {r.id: r.start for r in result.records} == EXPECTED_STARTS[policy]
    assert all(r.end == r.start + j.run_time for r, j in zip(result.records, POLICIES, strict=True))


def test_easy_backfills_only_jobs_that_do_not_delay_the_head() -> None:
    jobs = [job(1, 0, 2, 100), job(2, 1, 4, 10), job(3, 2, 2, 50), job(4, 3, 2, 200, req=200)]
    starts = {r.id: r.start for r in simulate(jobs, unit_cluster(4), "easy").records}
    # 3 ends by the shadow time (100) and backfills; 4 would run past it with no extra units.
    assert starts == {1: 0, 2: 100, 3: 2, 4: 110}


def test_a_job_ends_at_its_run_time_and_is_placed_on_named_units() -> None:
    [record] = simulate([job(1, 5, 2, 30, req=60)], unit_cluster(3)).records
    assert (record.start, record.end, record.nodes, record.state) == (5, 35, ("u0001", "u0002"), "COMPLETED")


# 2 units: 1 takes both for 5 s; 2 and 3 (one unit each) wait 4 s and 3 s.
TINY = [job(1, 0, 2, 5, req=10), job(2, 1, 1, 20), job(3, 2, 1, 100)]


def test_metrics_of_a_tiny_case_computed_by_hand() -> None:
    m = metrics(simulate(TINY, unit_cluster(2), "fifo"))
    assert m.jobs == 3
    assert m.mean_wait == pytest.approx(7 / 3)
    assert (m.p50_wait, m.p95_wait, m.max_wait) == (3, 4, 4)
    # max(1, 5/10) = 1, (4 + 20)/20 = 1.2, (3 + 100)/100 = 1.03
    assert m.mean_bounded_slowdown == pytest.approx((1 + 1.2 + 1.03) / 3)
    assert m.makespan == 105
    assert m.utilisation == pytest.approx((5 * 2 + 20 + 100) / (2 * 105))
    assert "mean bounded slowdown  1.08" in format_metrics(m)


def test_starts_csv() -> None:
    out = io.StringIO()
    write_starts(simulate(TINY, unit_cluster(2), "fifo").records, out)
    assert (
        out.getvalue() == "id,submit,start,end,nodes\n1,0,0,5,u[0001-0002]\n2,1,5,25,u0001\n3,2,5,105,u0002\n"
    )


def test_a_job_larger_than_the_cluster_is_refused_before_the_run() -> None:
    with pytest.raises(SimError, match=r"job 2 .* can never run in partition 'sim'"):
        simulate([job(1, 0, 1, 10), job(2, 0, 5, 10)], unit_cluster(4))


GPU_CLUSTER = """
[cluster]
name = "sim"
[[nodes]]
names = "gpu[01-02]"
cpus = 8
memory = "64G"
gpus = 4
gpu_type = "h100"
[[partitions]]
name = "gpu"
nodes = "gpu[01-02]"
default = true
default_time = "0:30"
"""


def test_gpu_jobs_on_a_configured_cluster_share_nodes_by_gpu_and_time_out_at_the_default_limit() -> None:
    cluster = config_cluster(parse_config(GPU_CLUSTER))
    jobs = [
        SimJob(1, 0, 100, 100, 4, nodes=1, gpus_per_node=4),
        SimJob(2, 0, 100, 100, 2, nodes=1, gpus_per_node=2),
        SimJob(3, 0, 100, 100, 2, nodes=1, gpus_per_node=2, gpu_type="h100"),
        SimJob(4, 1, 100, None, 8, nodes=2, gpus_per_node=4),  # no limit: the partition's 30 s
    ]
    result = simulate(jobs, cluster, "easy")
    assert cluster.capacity == 8
    assert [(r.start, r.end, r.state) for r in result.records] == [
        (0, 100, "COMPLETED"),
        (0, 100, "COMPLETED"),
        (0, 100, "COMPLETED"),
        (100, 130, "TIMEOUT"),
    ]
    assert metrics(result).utilisation == pytest.approx((400 + 200 + 200 + 240) / (8 * 130))


def test_the_command_prints_metrics_and_writes_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.swf"
    rest = "-1 1 1 1 -1 -1 -1 -1 -1"
    trace.write_text(f"; tiny\n1 0 -1 5 2 -1 -1 2 10 {rest}\n2 1 -1 20 1 -1 -1 1 20 {rest}\n")
    starts = tmp_path / "starts.csv"
    assert corral_main(["sim", str(trace), "--units", "2", "--policy", "fifo", "--starts", str(starts)]) == 0
    assert "jobs                   2\n" in capsys.readouterr().out
    assert starts.read_text().splitlines()[1:] == ["1,0,0,5,u[0001-0002]", "2,1,5,25,u0001"]


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, ["--units", "4"], "corral sim: error: {trace}: cannot read the trace"),
        ("; c\n1 0 -1 5\n", ["--units", "4"], "corral sim: error: {trace}:2: 4 fields"),
        ("; only comments\n", ["--units", "4"], "corral sim: error: {trace}: no jobs"),
        ("1 0 -1 5 8 -1 -1 8 9 -1 1 1 1 -1 -1 -1 -1 -1\n", ["--units", "4"], "can never run"),
        ("1 0 -1 5 1 -1 -1 1 9 -1 1 1 1 -1 -1 -1 -1 -1\n", [], "give either --units N"),
    ],
    ids=["missing file", "malformed line", "no jobs", "too large", "no cluster"],
)
def test_the_command_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, args: list[str], message: str
) -> None:
    trace = tmp_path / "t.swf"
    if content is not None:
        trace.write_text(content)
    assert sim_main([str(trace), *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert message.format(trace=trace) in err
