"""The simulator with a configuration's whole policy: priority weights, fair share, tiers, preemption,
begin times through ``Plan.wake_at``, and ``corral sim --config/--set``."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import T0, Log, allocated, cluster, exited, job, submitted

from corral.cli.sim import main as sim_main
from corral.libs.config.cluster import parse_config
from corral.libs.sim.engine import config_cluster, simulate, unit_cluster
from corral.libs.sim.eventlog import log_cluster, log_workload
from corral.libs.sim.workload import SimJob
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

#: One node with one GPU; a low and a high partition on it (the scheduler section is filled in per case).
ONE_GPU = """
[cluster]
name = "sim"
[scheduler]
{scheduler}
[[nodes]]
names = "gpu01"
cpus = 8
memory = "64G"
gpus = 1
[[partitions]]
name = "low"
nodes = "gpu01"
default = true
{low}
[[partitions]]
name = "high"
nodes = "gpu01"
priority_tier = 2
{accounts}
"""

ACCOUNTS = """
[[accounts]]
name = "phys"
parent = "root"
shares = 1
users = ["ann"]
[[accounts]]
name = "chem"
parent = "root"
shares = 1
users = ["bob"]
"""


def config_text(scheduler: str = "", low: str = "", accounts: str = "") -> str:
    """The one-GPU cluster with these [scheduler] keys, keys of partition ``low`` and accounts."""
    return ONE_GPU.format(scheduler=scheduler, low=low, accounts=accounts)


def gpu_job(job_id: int, submit: float, user: str, run: float = 100, partition: str | None = None) -> SimJob:
    """A one-GPU job of ``user`` running ``run`` seconds (limit 1000 s)."""
    return SimJob(job_id, submit, run, 1000, 1, nodes=1, gpus_per_node=1, user=user, partition=partition)


# The GPU is busy until 110: ann's job 1 ran 0-10 (billed 10 GPU-s to ann), cid's job 2 runs 10-110.
# Jobs 3 (ann, submitted at 20) and 4 (bob, at 30) wait; at 110 one of them starts, the other at 210.
CONTENDED = [
    gpu_job(1, 0, "ann", run=10),
    gpu_job(2, 10, "cid"),
    gpu_job(3, 20, "ann"),
    gpu_job(4, 30, "bob"),
]


@pytest.mark.parametrize(
    ("scheduler", "accounts", "tier", "first"),
    [
        # No weights: FIFO within a tier, job 3 first.
        ("", "", None, 3),
        # Fair share: ann has used 10 GPU-s, bob nothing: bob's job 4 first (every user its own account).
        ("priority_weight_fairshare = 1000", "", None, 4),
        # The same with a configured tree: ann in phys, bob in chem (the gateway's default accounts).
        ("priority_weight_fairshare = 1000", ACCOUNTS, None, 4),
        # Age outweighs fair share: at 110 job 3 has waited 90 s of 100 (age 90000), job 4 80 s (80000);
        # the fair-share factors differ by at most 1 (at most 1000).
        (
            'priority_weight_fairshare = 1000\npriority_weight_age = 100000\npriority_max_age = "0:01:40"',
            "",
            None,
            3,
        ),
        # A higher tier goes first whatever the weights: job 4 in partition high.
        ("", "", "high", 4),
    ],
    ids=["fifo", "fairshare", "fairshare-accounts", "age-over-fairshare", "tier"],
)
def test_the_configs_priority_orders_the_queue(
    scheduler: str, accounts: str, tier: str | None, first: int
) -> None:
    jobs = list(CONTENDED)
    if tier is not None:
        jobs[3] = gpu_job(4, 30, "bob", partition=tier)
    result = simulate(jobs, config_cluster(parse_config(config_text(scheduler, accounts=accounts))), "easy")
    starts = {r.id: r.start for r in result.records}
    second = 7 - first
    assert (starts[1], starts[2], starts[first], starts[second]) == (0, 10, 110, 210)


@pytest.mark.parametrize(
    ("low", "victim"),
    [
        # Job 1 (low) is preempted at 10 for job 2 (high), exits at 10 + 30 s grace, is requeued, runs
        # job 2's 50 s after it (40-90) and then whole again: its record is its last run.
        ('preempt_mode = "requeue"\ngrace_time = 30', (90.0, 190.0, "COMPLETED")),
        # Cancel mode: it ends PREEMPTED at the end of its grace.
        ('preempt_mode = "cancel"\ngrace_time = 30', (0.0, 40.0, "PREEMPTED")),
        # No grace (0: KillWait): the simulated run exits at once and job 2 starts in the same second.
        ('preempt_mode = "cancel"', (0.0, 10.0, "PREEMPTED")),
    ],
    ids=["requeue", "cancel", "no-grace"],
)
def test_preemption_in_the_sim_ends_the_victim_after_its_grace(
    low: str, victim: tuple[float, float, str]
) -> None:
    config = parse_config(config_text('preempt_type = "partition_prio"', low=low))
    jobs = [gpu_job(1, 0, "ann"), gpu_job(2, 10, "bob", run=50, partition="high")]
    records = {r.id: r for r in simulate(jobs, config_cluster(config), "easy").records}
    assert (records[1].start, records[1].end, records[1].state) == victim
    preemptor_start = victim[1] if victim[2] == "PREEMPTED" else 40.0
    assert (records[2].start, records[2].end, records[2].state) == (
        preemptor_start,
        preemptor_start + 50,
        "COMPLETED",
    )


def test_without_preemption_the_high_job_waits() -> None:
    config = parse_config(config_text(low='preempt_mode = "requeue"'))
    jobs = [gpu_job(1, 0, "ann"), gpu_job(2, 10, "bob", run=50, partition="high")]
    records = simulate(jobs, config_cluster(config), "easy").records
    assert [(r.start, r.end) for r in records] == [(0, 100), (100, 150)]


def begin_job(job_id: int, submit: float, run: float, begin: float | None) -> SimJob:
    """A one-unit job with a begin time (a spec of its own, as a replayed log has)."""
    spec = ev.JobSpec(
        name="b", script="", workdir="/", nodes=1, ntasks=1, time_limit_s=1000, begin_time=begin
    )
    return SimJob(job_id, submit, run, 1000, 1, spec=spec)


def test_begin_times_are_honoured_through_wake_at() -> None:
    # Nothing happens at 50 or 70 but the begin times: the engine plans again then (job 1 alone would
    # otherwise never start); job 3's begin time is already past at its submit.
    jobs = [
        begin_job(1, 0, 10, 50.0),
        begin_job(2, 0, 30, None),
        begin_job(3, 5, 10, 1.0),
        begin_job(4, 6, 5, 70),
    ]
    records = {r.id: r for r in simulate(jobs, unit_cluster(2), "easy").records}
    assert {i: (r.start, r.end) for i, r in records.items()} == {
        1: (50, 60),
        2: (0, 30),
        3: (5, 15),
        4: (70, 75),
    }


def test_a_replayed_log_keeps_its_begin_times() -> None:
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, time_s=600, partition="gpu", begin_time=T0 + 100)), step=1.0)
    log.add(allocated(1, {"gpu01": list(range(8))}), step=99.0)  # at its begin time, t0+100
    log.add(exited(1, "gpu01"), step=20.0)
    log.add(ev.JobCompleted(job_id=1, attempt=0), step=0.0)
    workload = log_workload(log.entries)
    [sim_job] = workload.jobs
    assert sim_job.spec is not None and sim_job.spec.begin_time == T0 + 100
    [record] = simulate(workload.jobs, log_cluster(workload.nodes), "easy").records
    assert (record.start - T0, record.end - T0) == (100.0, 120.0)


CSV = (
    "id,submit,duration,time_limit,nodes,gpus_per_node,user\n1,0,10,1000,1,1,ann\n2,10,100,1000,1,1,cid\n"
    "3,20,100,1000,1,1,ann\n4,30,100,1000,1,1,bob\n"
)


@pytest.mark.parametrize(
    ("args", "order"),
    [
        ([], [1, 2, 3, 4]),
        (["--set", "priority_weight_age=5"], [1, 2, 3, 4]),
        (["--set", "scheduler.priority_weight_fairshare=1000"], [1, 2, 4, 3]),
        (["--set", "priority_weight_fairshare=1000", "--set", "fairshare=classic"], [1, 2, 4, 3]),
    ],
    ids=["file", "set-age", "set-fairshare", "set-classic"],
)
def test_the_command_simulates_with_the_configs_weights(
    tmp_path: Path, args: list[str], order: list[int]
) -> None:
    conf = tmp_path / "cluster.toml"
    conf.write_text(config_text())
    trace, starts = tmp_path / "jobs.csv", tmp_path / "starts.csv"
    trace.write_text(CSV)
    assert sim_main([str(trace), "--config", str(conf), "--starts", str(starts), *args]) == 0
    rows = [line.split(",") for line in starts.read_text().splitlines()[1:]]
    assert [int(r[0]) for r in sorted(rows, key=lambda r: (float(r[2]), int(r[0])))] == order


def test_the_command_picks_up_the_weights_of_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.toml"
    conf.write_text(config_text("priority_weight_fairshare = 1000"))
    trace, starts = tmp_path / "jobs.csv", tmp_path / "starts.csv"
    trace.write_text(CSV)
    assert sim_main([str(trace), "--config", str(conf), "--starts", str(starts)]) == 0
    assert sim_main([str(trace), "--config", str(conf), "--starts", str(starts), "--policy", "fifo"]) == 0
    rows = {int(r.split(",")[0]): float(r.split(",")[2]) for r in starts.read_text().splitlines()[1:]}
    assert rows[4] == 110 and rows[3] == 210


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--units", "2", "--set", "fairshare=classic"],
            "corral sim: error: --set overrides keys of --config",
        ),
        (["--config", "{conf}", "--set", "nokey"], "corral sim: error: --set: expected KEY=VALUE"),
        (["--config", "{conf}", "--set", "weight=1"], "corral sim: error: scheduler: unknown key 'weight'"),
        (
            ["--config", "{conf}", "--set", "fairshare=fair"],
            "corral sim: error: scheduler.fairshare: 'fair' is not one of fair_tree, classic",
        ),
    ],
    ids=["no-config", "no-value", "unknown-key", "bad-value"],
)
def test_bad_overrides_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    conf = tmp_path / "cluster.toml"
    conf.write_text(config_text())
    trace = tmp_path / "jobs.csv"
    trace.write_text(CSV)
    assert sim_main([str(trace), *[a.format(conf=conf) for a in args]]) == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_a_switches_count_no_block_can_meet_lapses_after_its_wait() -> None:
    # Two units, each a block of its own: --switches=1 for 2 nodes cannot be met; after its 3 s wait the
    # core places the job without it, and the engine plans again then (nothing else happens at 13).
    spec = ev.JobSpec(name="s", script="", workdir="/", nodes=2, ntasks=2, switches=1, switches_wait_s=3)
    [record] = simulate([SimJob(1, 10, 5, 100, 2, spec=spec)], unit_cluster(2), "easy").records
    assert (record.start, record.end, record.nodes) == (13, 18, ("u0001", "u0002"))
