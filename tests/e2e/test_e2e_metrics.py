"""Prometheus metrics of a whole local cluster, scraped over HTTP from every process as Prometheus would and
parsed with prometheus-client's parser: the queue, the GPUs, the cycles, the API and the agents' launches
move as the jobs do."""

from __future__ import annotations

import getpass
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e2e_cli import Cli, own_cluster
from prometheus_client.parser import text_string_to_metric_families

from corral.libs.config.cluster import local_config_text

pytestmark = pytest.mark.e2e

NODES, GPUS = 2, 2
HOLD = "#!/bin/sh\n#SBATCH --gres=gpu:2\nsleep 300\n"
QUICK = "#!/bin/sh\n#SBATCH --gres=gpu:1\ntrue\n"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, dict[str, str]]]:
    """A cluster of our own (2 nodes x 2 GPUs: nothing else runs on it) and its metrics URLs."""
    names = [f"node{i}" for i in range(1, NODES + 1)]
    config = local_config_text("metrics", names, GPUS, 8, 16 * 1024)
    with own_cluster(tmp_path_factory.mktemp("metrics"), config, nodes=NODES, gpus_per_node=GPUS) as cli:
        urls = json.loads((Path(cli.env["CORRAL_STATE_DIR"]) / "metrics.json").read_text())
        yield cli, urls


def scrape(url: str) -> Samples:
    """Every sample of one endpoint, by (name, labels)."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def wait_metric(
    url: str, name: str, want: Callable[[float], bool], timeout: float = 30.0, **labels: str
) -> Samples:
    """Scrape until ``want(total(name, labels))`` holds; the last scrape."""
    deadline = time.monotonic() + timeout
    samples = scrape(url)
    while not want(total(samples, name, **labels)):
        if time.monotonic() > deadline:
            got = total(samples, name, **labels)
            raise AssertionError(f"{name}{labels} = {got} at {url} after {timeout}s")
        time.sleep(0.3)
        samples = scrape(url)
    return samples


def squeue_gpus(cli: Cli) -> dict[str, int]:
    """GPUs of the running jobs by node, as squeue shows them (``%N``, ``%b`` = gres:gpu:N per node)."""
    out = cli("squeue", "-h", "-t", "R", "-o", "%N %b")
    assert out.returncode == 0, out.stderr
    gpus: dict[str, int] = {}
    for line in out.stdout.splitlines():
        nodes, tres = line.split()
        assert nodes.startswith("node") and "," not in nodes and "[" not in nodes, line  # one node each
        gpus[nodes] = gpus.get(nodes, 0) + int(tres.rsplit(":", 1)[1])
    return gpus


def test_metrics_follow_the_jobs(cluster: tuple[Cli, dict[str, str]]) -> None:
    cli, urls = cluster
    services = {"gateway", "scheduler", "accounting", "health", "auth", "feed"}
    assert set(urls) == services | {"agent-node1", "agent-node2"}
    for url in urls.values():
        assert url.startswith("http://127.0.0.1:")
        scrape(url)  # each serves and parses
    scheduler, gateway = urls["scheduler"], urls["gateway"]
    agents = [urls["agent-node1"], urls["agent-node2"]]
    # The queue and GPU gauges are counted at most once a second (the scheduler's metrics.REFRESH_S): the
    # nodes' registrations show within that.
    before = wait_metric(scheduler, "corral_gpus", lambda v: v == NODES * GPUS, state="idle")
    cycles = total(before, "corral_scheduler_cycle_duration_seconds_count")
    assert total(before, "corral_jobs_pending") == 0

    # Two jobs fill the cluster; two more queue behind them.
    holders = [cli.sbatch(HOLD) for _ in range(NODES)]
    for job in holders:
        cli.wait_state(job, ("RUNNING",))
    queued = [cli.sbatch(QUICK) for _ in range(2)]
    samples = wait_metric(scheduler, "corral_jobs_pending", lambda v: v == 2, partition="gpu")
    # The first waits for resources, the second behind it (squeue's reasons).
    assert total(samples, "corral_jobs_pending", reason="Resources") == 1
    assert total(samples, "corral_jobs_pending", reason="Priority") == 1
    assert total(samples, "corral_gpus", state="allocated") == NODES * GPUS
    assert total(samples, "corral_gpus", state="idle") == 0
    shown = squeue_gpus(cli)
    assert shown == {f"node{i}": GPUS for i in range(1, NODES + 1)}
    for node, gpus in shown.items():
        assert total(samples, "corral_gpus", node=node, state="allocated") == gpus
    # No --account: a job's account is its user's.
    assert total(samples, "corral_gpus_allocated_by_account", account=getpass.getuser()) == NODES * GPUS

    # Cancelling the holders lets the queued jobs start: nothing is pending, nothing stays allocated.
    cancels = total(scrape(gateway), "corral_api_request_duration_seconds_count", verb="cancel")
    out = cli("scancel", *map(str, holders))
    assert out.returncode == 0, out.stderr
    for job in queued:
        cli.wait_state(job, ("COMPLETED",))
    samples = wait_metric(scheduler, "corral_jobs_pending", lambda v: v == 0)
    samples = wait_metric(scheduler, "corral_gpus", lambda v: v == 0, state="allocated")
    assert total(samples, "corral_gpus", state="idle") == NODES * GPUS
    assert total(samples, "corral_gpus_allocated_by_account") == 0
    assert total(samples, "corral_scheduler_cycle_duration_seconds_count") > cycles
    assert total(samples, "corral_job_submit_to_start_seconds_count", partition="gpu") == 4
    assert total(samples, "corral_log_appends_total", event="job_allocated") == 4

    # The gateway served exactly the four submits and the one scancel, and appended four submissions.
    front = scrape(gateway)
    assert total(front, "corral_api_request_duration_seconds_count", verb="submit") == 4
    assert total(front, "corral_api_request_duration_seconds_count", verb="cancel") == cancels + 1
    assert total(front, "corral_api_errors_total", verb="submit") == 0
    assert total(front, "corral_log_appends_total", event="job_submitted") == 4

    # Four launches on the agents, each exit counted by outcome once reported.
    def agents_total(name: str, **labels: str) -> float:
        return sum(total(scrape(url), name, **labels) for url in agents)

    assert agents_total("corral_agent_launches_total", outcome="started") == 4
    assert agents_total("corral_agent_launches_total", outcome="failed") == 0
    deadline = time.monotonic() + 30
    while agents_total("corral_agent_run_exits_total") < 4 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert agents_total("corral_agent_run_exits_total", outcome="completed") == 2
    assert agents_total("corral_agent_run_exits_total") == 4

    # Every durable consumer reports its lag: accounting's on the log, each agent's on its work stream; all
    # caught up once the jobs are done.
    consumers = [(urls["accounting"], "CORRAL_EVENTS", "accounting")]
    consumers += [(url, "CORRAL_WORK", f"agent-node{i}") for i, url in enumerate(agents, 1)]
    for url, stream, consumer in consumers:
        key = ("corral_consumer_pending_messages", frozenset({("stream", stream), ("consumer", consumer)}))
        deadline = time.monotonic() + 15
        while scrape(url).get(key) != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert scrape(url).get(key) == 0, (consumer, scrape(url).get(key))
