"""Metrics: the scheduler's samples from its state, the agent's outcomes, the port setting, and every name the
Grafana dashboard and the Prometheus config use being one the code registers."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import Log, allocated, cluster, exited, job, policy, submitted
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from corral.libs.config.settings import metrics_port
from corral.libs.core.plan import plan
from corral.libs.runtime.metrics import Metrics, Snapshot
from corral.schemas import events as ev
from corral.services.agent.metrics import AgentMetrics, outcome_of
from corral.services.scheduler import metrics as scheduler_metrics
from corral.services.scheduler.metrics import (
    SchedulerMetrics,
    account_samples,
    gpu_samples,
    pending_samples,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
POLICY = policy()


def busy_cluster() -> Log:
    """Two 8-GPU nodes, gpu02 drained: job 1 (account ml) holds 6 GPUs of gpu01 for an hour; job 2 needs a
    whole node, job 3 (bob, no time limit) one GPU behind job 2's reservation; job 4 is held."""
    log = Log(*cluster(nodes=2, gpus=8))
    log.add(
        submitted(1, job(gpus=6, nodes=1, account="ml")),
        allocated(1, {"gpu01": [0, 1, 2, 3, 4, 5]}),
        ev.NodeDrained(node="gpu02", reason="maintenance", by="root"),
        submitted(2, job(gpus=8, nodes=1)),
        submitted(3, job(gpus=1, nodes=1), user="bob"),
        submitted(4, job(gpus=1, nodes=1)),
        ev.JobHoldRequested(job_id=4, user="alice"),
        ev.JobHeld(job_id=4, by="alice"),
    )
    return log


def test_pending_jobs_by_partition_and_reason() -> None:
    log = busy_cluster()
    outlook = plan(log.state, log.state.now, POLICY)
    assert outlook.decisions == []
    assert pending_samples(log.state, outlook, POLICY) == {
        ("gpu", "Resources"): 1.0,
        ("gpu", "Priority"): 1.0,
        ("gpu", "JobHeldUser"): 1.0,
    }
    # Job 1 ends: job 2 takes gpu01 whole; job 3 waits for resources now (nothing is free), job 4 is held.
    log.add(exited(1, "gpu01"))
    log.add(*plan(log.state, log.state.now, POLICY).decisions)
    log.add(*plan(log.state, log.state.now, POLICY).decisions)
    outlook = plan(log.state, log.state.now, POLICY)
    assert log.state.jobs[2].state == "RUNNING"
    assert pending_samples(log.state, outlook, POLICY) == {
        ("gpu", "Resources"): 1.0,
        ("gpu", "JobHeldUser"): 1.0,
    }


def test_gpus_by_node_type_and_state_add_up_to_each_node() -> None:
    log = busy_cluster()
    samples = gpu_samples(log.state)
    assert samples[("gpu01", "h100", "allocated")] == 6.0
    assert samples[("gpu01", "h100", "idle")] == 2.0
    assert samples[("gpu02", "h100", "drained")] == 8.0
    assert samples[("gpu02", "h100", "idle")] == 0.0
    log.add(ev.NodeDown(node="gpu01", reason="Not responding"))
    samples = gpu_samples(log.state)
    assert samples[("gpu01", "h100", "down")] == 8.0
    assert samples[("gpu01", "h100", "allocated")] == 0.0
    for node in ("gpu01", "gpu02"):
        assert sum(v for (n, _, _), v in samples.items() if n == node) == 8.0


def test_gpus_allocated_by_account() -> None:
    log = busy_cluster()
    log.add(submitted(5, job(gpus=2, nodes=1), user="bob"), allocated(5, {"gpu01": [6, 7]}))
    # Without --account a job's account is its user's (as squeue shows it).
    assert account_samples(log.state, POLICY) == {("ml", "gpu"): 6.0, ("bob", "gpu"): 2.0}
    log.add(exited(1, "gpu01"))
    log.add(*plan(log.state, log.state.now, POLICY).decisions)
    assert account_samples(log.state, POLICY) == {("bob", "gpu"): 2.0}


def test_a_snapshot_drops_label_sets_that_are_gone() -> None:
    registry = CollectorRegistry()
    gauge = Snapshot("corral_test_pending", "test", ["reason"], registry)
    gauge.set({("Resources",): 3.0, ("Priority",): 1.0})
    gauge.set({("Priority",): 2.0})
    text = generate_latest(registry).decode()
    assert 'corral_test_pending{reason="Priority"} 2.0' in text
    assert "Resources" not in text


@pytest.mark.parametrize(
    ("fields", "outcome"),
    [
        ({}, "completed"),
        ({"exit_code": 3}, "failed"),
        ({"exit_code": 137, "signal": 9}, "signaled"),
        ({"exit_code": 137, "signal": 9, "oom": True}, "oom"),
        ({"signal": 15, "timed_out": True}, "timeout"),
        ({"killed": True, "signal": 9}, "killed"),
        ({"exit_code": 1, "launch_error": "no such user"}, "launch_failed"),
    ],
    ids=["completed", "failed", "signaled", "oom", "timeout", "killed", "launch-failed"],
)
def test_run_exit_outcomes(fields: dict[str, object], outcome: str) -> None:
    assert outcome_of(exited(1, "gpu01", **fields)) == outcome


def test_agent_counts_a_failed_launch_as_a_launch_and_an_exit() -> None:
    registry = CollectorRegistry()
    agent = AgentMetrics(registry, "gpu01")
    agent.started()
    agent.exited(exited(1, "gpu01"))
    agent.exited(exited(2, "gpu01", exit_code=1, launch_error="no such user"))
    value = registry.get_sample_value
    assert value("corral_agent_launches_total", {"node": "gpu01", "outcome": "started"}) == 1.0
    assert value("corral_agent_launches_total", {"node": "gpu01", "outcome": "failed"}) == 1.0
    assert value("corral_agent_run_exits_total", {"node": "gpu01", "outcome": "completed"}) == 1.0
    assert value("corral_agent_run_exits_total", {"node": "gpu01", "outcome": "launch_failed"}) == 1.0


@pytest.mark.parametrize(
    ("value", "port"),
    [(None, 0), ("", 0), ("0", 0), ("9472", 9472), ("off", None), ("OFF", None), ("-1", None)],
    ids=["unset", "empty", "free", "fixed", "off", "off-upper", "minus-one"],
)
def test_metrics_port_setting(value: str | None, port: int | None) -> None:
    assert metrics_port(value) == port


@pytest.mark.parametrize("value", ["http", "70000", "-2", "9472x"])
def test_a_bad_metrics_port_names_the_setting_and_the_fix(value: str) -> None:
    with pytest.raises(ValueError, match=r"--metrics-port \(CORRAL_METRICS_PORT\) must be a port number"):
        metrics_port(value)


def exposed() -> dict[str, set[str]]:
    """Every sample name the code can expose, with the label names of each: the families of every service.

    An unused labelled family has no samples yet, so the label names are read from the family objects
    (prometheus-client keeps them in ``_labelnames``; a ``Snapshot`` in ``labels``).
    """
    registry = Metrics().registry
    holders = [Metrics(), SchedulerMetrics(registry), AgentMetrics(registry, "gpu01")]
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"], "gauge": [""]}
    names: dict[str, set[str]] = {}
    for holder in holders:
        for family in vars(holder).values():
            if isinstance(family, Snapshot):
                name, kind, labels = family.name, "gauge", set(family.labels)
            elif isinstance(family, MetricWrapperBase):
                name, kind, labels = family._name, family._type, set(family._labelnames)
            else:
                continue
            for suffix in suffixes[kind]:
                names[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return names


def dashboard_exprs() -> list[str]:
    """Every PromQL expression of the Grafana dashboard."""
    dashboard = json.loads((ROOT / "infra/grafana/corral.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    return exprs


def test_the_dashboard_uses_only_metrics_and_labels_the_code_registers() -> None:
    names = exposed()
    used: set[str] = set()
    for expr in dashboard_exprs():
        metrics_in = set(re.findall(r"\bcorral_[a-z_]+", expr))
        assert metrics_in, f"a query names no Corral metric: {expr}"
        for name in metrics_in:
            assert name in names, f"the dashboard queries {name}, which no code registers: {expr}"
        used |= metrics_in
        grouped = {g.strip() for by in re.findall(r"by \(([^)]*)\)", expr) for g in by.split(",")}
        selected = set(re.findall(r"(\w+)\s*(?:=~|!=|=)\s*\"", expr))
        declared = set().union(*(names[n] for n in metrics_in))
        for label in grouped | selected:
            assert label in declared, f"label {label!r} is on none of {sorted(metrics_in)}: {expr}"
    # Every family the issue asks for is on the dashboard (a renamed metric breaks this test, not a panel).
    for family in (
        "corral_jobs_pending",
        "corral_gpus",
        "corral_gpus_allocated_by_account",
        "corral_scheduler_cycle_duration_seconds_bucket",
        "corral_job_submit_to_start_seconds_bucket",
        "corral_log_appends_total",
        "corral_consumer_pending_messages",
        "corral_dead_letters_total",
        "corral_api_request_duration_seconds_bucket",
        "corral_api_errors_total",
        "corral_agent_launches_total",
        "corral_agent_run_exits_total",
    ):
        assert family in used, f"the dashboard shows no {family}"


def test_the_names_follow_prometheus_conventions() -> None:
    for name in exposed():
        assert name.startswith("corral_"), name
        assert re.fullmatch(r"[a-z_]+", name), name


def test_the_scrape_config_parses_and_names_every_service() -> None:
    config = yaml.safe_load((ROOT / "infra/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for service in ("gateway", "scheduler", "accounting", "health", "agent"):
        assert f"corral-{service}" in jobs
    # The fixed ports of the scrape config are the systemd units' ports.
    for name, job_config in jobs.items():
        for static in job_config.get("static_configs", []):
            unit = "corral-agent@" if name == "corral-agent" else name
            text = (ROOT / f"infra/systemd/{unit}.service").read_text()
            for target in static["targets"]:
                assert f"--metrics-port {target.rsplit(':', 1)[1]}" in text, (name, target)


def test_exposition_parses() -> None:
    metrics = Metrics()
    metrics.appended("job_submitted")
    metrics.served("submit", 0.004, None)
    metrics.served("submit", 0.002, "invalid")
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    assert families["corral_log_appends"].samples[0].value == 1.0
    samples = families["corral_api_request_duration_seconds"].samples
    assert next(s.value for s in samples if s.name.endswith("_count")) == 2.0


def pending_gauge(metrics: SchedulerMetrics) -> float:
    """The pending jobs the gauge shows now."""
    return sum(sample.value for family in metrics.pending.collect() for sample in family.samples)


async def test_the_queue_gauges_are_counted_at_most_once_a_refresh_period_and_then_are_current(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Counting passes over every pending job; cycles come tens of times a second while jobs flow. A cycle
    # within REFRESH_S of the last count leaves it to a timer, which counts the state as it is then.
    monkeypatch.setattr(scheduler_metrics, "REFRESH_S", 0.05)
    metrics = SchedulerMetrics(CollectorRegistry())
    now = [100.0]
    metrics.clock = lambda: now[0]
    log = busy_cluster()
    metrics.cycled(log.state, plan(log.state, log.state.now, POLICY), POLICY, 0.01)
    assert pending_gauge(metrics) == 3
    log.add(submitted(5, job(gpus=1, nodes=1)), submitted(6, job(gpus=1, nodes=1)))
    now[0] += 0.01
    metrics.cycled(log.state, plan(log.state, log.state.now, POLICY), POLICY, None)
    assert pending_gauge(metrics) == 3  # not counted again yet
    log.add(submitted(7, job(gpus=1, nodes=1)))
    metrics.cycled(log.state, plan(log.state, log.state.now, POLICY), POLICY, None)  # one timer for both
    now[0] += 0.05
    for _ in range(500):
        if pending_gauge(metrics) != 3:
            break
        await asyncio.sleep(0.01)
    assert pending_gauge(metrics) == 6  # the state as it is when the timer fires
    counts = [s.value for s in metrics.cycle_seconds.collect()[0].samples if s.name.endswith("_count")]
    assert counts == [1]  # (every planning cycle is observed at once)


async def test_a_long_count_of_the_queue_puts_the_next_one_further_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A million pending jobs take ~0.4 s to count: counted every second, that was 40% of the loop. A count
    that took ``d`` is followed by none for ``d / REFRESH_SHARE`` (here 1 s: 20 s), then counts again."""
    now = [100.0]
    counted = scheduler_metrics.pending_samples

    def slow_count(*args: Any) -> dict[tuple[str, ...], float]:
        now[0] += 1.0  # (the count takes a second, by the metrics' clock)
        return counted(*args)

    monkeypatch.setattr(scheduler_metrics, "pending_samples", slow_count)
    metrics = SchedulerMetrics(CollectorRegistry())
    metrics.clock = lambda: now[0]
    log = busy_cluster()
    metrics.cycled(log.state, plan(log.state, log.state.now, POLICY), POLICY, 0.01)
    assert pending_gauge(metrics) == 3
    log.add(submitted(5, job(gpus=1, nodes=1)))
    now[0] = 100.0 + 19.0  # past REFRESH_S, not past 20 s
    metrics.cycled(log.state, plan(log.state, log.state.now, POLICY), POLICY, None)
    assert pending_gauge(metrics) == 3
    now[0] = 100.0 + 20.5
    metrics.cycled(log.state, plan(log.state, log.state.now, POLICY), POLICY, None)
    assert pending_gauge(metrics) == 4
