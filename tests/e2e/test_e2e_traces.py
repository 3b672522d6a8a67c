"""One trace per job, end to end: a local cluster of real processes exports over OTLP/HTTP to a real receiver
(``tests/otlp_receiver.py``, decoding with opentelemetry-proto), and the span trees it receives are the jobs':
a 1-node job continuing its caller's TRACEPARENT, a 2-node GPU job with an srun step over both nodes, an
array, a preempted job, a job requeued after its node's agent is killed; a tracer restart exports nothing
twice, and a second pass over the log with a new consumer gives the same span ids. ``corral trace`` draws
the same spans from the log."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import otlp_receiver
import pytest
from e2e_cli import BIN, Cli, as_local, user_env
from otlp_receiver import OtlpReceiver, ReceivedSpan

from corral.cli.local_cluster import LocalCluster, ensure_resolvable
from corral.libs.infra import roles

pytestmark = pytest.mark.e2e

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"

#: Two nodes of two GPUs; "low" (the default) may be preempted by "high"; a node is down after 6 s.
CONFIG = """
[cluster]
name = "local"
heartbeat_interval = 1
node_timeout = 6
kill_wait = 1

[scheduler]
preempt_type = "partition_prio"
preempt_mode = "requeue"

[[nodes]]
names = "node[1-2]"
cpus = 8
memory = "8G"
gpus = 2
gpu_type = "sim"

[[partitions]]
name = "low"
nodes = "node[1-2]"
default = true

[[partitions]]
name = "high"
nodes = "node[1-2]"
priority_tier = 2
"""


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    """The receiver every service of the cluster exports to."""
    yield from otlp_receiver.serve()


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver
) -> Iterator[tuple[LocalCluster, Cli]]:
    """A cluster whose services export to ``otlp`` (so ``corral up`` starts the tracer too); the variables
    stay set while it runs, for the processes the tests restart."""
    root = tmp_path_factory.mktemp("traces")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        mp.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
        cluster = LocalCluster(root / "state", getpass.getuser(), nodes=2, gpus_per_node=2)
        cluster.state_dir.mkdir(mode=0o700)
        cluster.config_path.write_text(as_local(CONFIG))
        assert ensure_resolvable([n.name for n in cluster.prepare().nodes]) is None
        cluster.start(ready_timeout=90)
        assert "tracer" in [p.name for p in cluster.processes]
        try:
            yield cluster, Cli(env=user_env(cluster.state_dir, commands_on_path=True), workdir=root)
        finally:
            cluster.stop()


def derived(
    otlp: OtlpReceiver, job: int, until: Callable[[dict[str, ReceivedSpan]], bool]
) -> dict[str, ReceivedSpan]:
    """The tracer's spans of ``job`` by name (`` @k`` for a node's or step's spans of attempt k > 0), once
    ``until`` holds for them."""

    def of_job(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
        found: dict[str, ReceivedSpan] = {}
        job_span = next((s for s in spans if s.name == f"job {job}" and s.service == "corral-jobs"), None)
        trace = job_span.trace_id if job_span else None
        for span in spans:
            if span.service != "corral-jobs" or span.trace_id != trace:
                continue
            if span.attributes.get("corral.span.kind") == "job" and span.name != f"job {job}":
                continue  # another task of the same array
            attempt = span.attributes.get("corral.attempt", 0)
            kind = span.attributes.get("corral.span.kind")
            key = f"{span.name} @{attempt}" if attempt and kind in ("launch", "run", "step") else span.name
            found.setdefault(key, span)
        return found

    return of_job(otlp.wait_for(lambda spans: until(of_job(spans)), timeout=60))


def parent_of(spans: dict[str, ReceivedSpan], name: str) -> str:
    """The name of a span's parent among ``spans``."""
    names = {s.span_id: n for n, s in spans.items()}
    return names.get(spans[name].parent_id, "?")


def done(spans: dict[str, ReceivedSpan]) -> bool:
    return "conclude" in spans


def audited(cli: Cli, job: int | str) -> list[dict[str, Any]]:
    """``corral audit --json``'s entries for ``job`` (an id or ``A_T``; the same log the spans come from)."""
    out = corral(cli, "audit", "--json", str(job))
    assert out.returncode == 0, out.stderr
    entries: list[dict[str, Any]] = json.loads(out.stdout)["entries"]
    return entries


def of(entries: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["event"] == event]


def test_a_one_node_job_continues_the_callers_trace(
    traced: tuple[LocalCluster, Cli], otlp: OtlpReceiver
) -> None:
    _, cli = traced
    cli.env["TRACEPARENT"] = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    try:
        job = cli.sbatch("#!/bin/bash\n#SBATCH --gres=gpu:1 -o trace-%j.out\necho $TRACEPARENT\n")
    finally:
        del cli.env["TRACEPARENT"]
    assert cli.wait_state(job, ("COMPLETED",)) == "COMPLETED|0:0"
    spans = derived(otlp, job, done)
    assert {s.trace_id for s in spans.values()} == {CALLER_TRACE}
    assert set(spans) == {f"job {job}", "queued", "attempt 0", "launch node1", "run node1", "conclude"}
    assert parent_of(spans, "run node1") == "attempt 0" and parent_of(spans, "attempt 0") == f"job {job}"
    # The services' own short spans are in the same trace: the gateway's submit (the caller's child and the
    # job span's parent), the scheduler's decision, the agent's launch and its report of the exit.
    wanted = {
        ("corral-gateway", "submit"),
        ("corral-scheduler", "append job_allocated"),
        ("corral-agent", "launch"),
        ("corral-agent", "append run_exited"),
    }
    trace = otlp.wait_for(
        lambda received: wanted <= {(s.service, s.name) for s in received if s.trace_id == CALLER_TRACE}
    )
    [submit] = [
        s for s in trace if s.trace_id == CALLER_TRACE and (s.service, s.name) == ("corral-gateway", "submit")
    ]
    assert submit.parent_id == CALLER_SPAN and spans[f"job {job}"].parent_id == submit.span_id
    root = spans[f"job {job}"].attributes
    assert root["corral.job.state"] == "COMPLETED" and root["enduser.id"] == getpass.getuser()
    assert root["corral.gpu.count"] == 1 and root["corral.partition"] == "low"
    assert spans["run node1"].attributes["process.exit.code"] == 0
    # Inside the job, TRACEPARENT names its attempt span: what the job submits continues its trace.
    inside = (cli.workdir / f"trace-{job}.out").read_text().strip()
    assert inside == f"00-{CALLER_TRACE}-{spans['attempt 0'].span_id}-01"
    # corral trace draws the same spans, from the log.
    out = corral(cli, "trace", str(job), "--json")
    assert out.returncode == 0, out.stderr
    drawn = json.loads(out.stdout)
    ids = {s["span_id"]: s["name"] for s in drawn["spans"] if s["exporter"] == "tracer"}
    assert ids == {s.span_id: s.name for s in spans.values()}
    text = corral(cli, "trace", str(job)).stdout
    assert f"└─ job {job}" in text and "├─ attempt 0" in text and "run node1" in text, text

    # Accounting's Postgres transaction that applied the job's entries: a root span linked to the trace.
    def transactions(received: list[ReceivedSpan]) -> list[ReceivedSpan]:
        return [
            s
            for s in received
            if (s.service, s.name) == ("corral-accounting", "accounting transaction")
            and CALLER_TRACE in {trace for trace, _ in s.links}
        ]

    linked = transactions(otlp.wait_for(transactions))
    assert linked[0].attributes["db.system"] == "postgresql" and linked[0].parent_id == ""
    # corral audit of the same job: who did each step and why, in log order.
    history = audited(cli, job)
    assert [e["event"] for e in history] == [
        "job_submitted",
        "job_allocated",
        "run_started",
        "run_exited",
        "job_completed",
    ]
    assert of(history, "job_submitted")[0]["actor"] == getpass.getuser()
    assert of(history, "job_allocated")[0]["why"] == [f"job_submitted by {getpass.getuser()}"]
    assert of(history, "run_started")[0]["why"][0].startswith("job_allocated")
    assert of(history, "job_completed")[0]["why"][0].startswith("run_exited")


def test_a_two_node_gpu_job_with_an_srun_step(traced: tuple[LocalCluster, Cli], otlp: OtlpReceiver) -> None:
    _, cli = traced
    job = cli.sbatch(f"#!/bin/bash\n#SBATCH -N2 --gres=gpu:2\n{BIN}/srun -N2 hostname\n")
    assert cli.wait_state(job, ("COMPLETED",)) == "COMPLETED|0:0"
    spans = derived(otlp, job, done)
    for node in ("node1", "node2"):
        for kind in ("launch", "run"):
            span = spans[f"{kind} {node}"]
            assert parent_of(spans, f"{kind} {node}") == "attempt 0"
            assert span.attributes["corral.gpu.indices"] == [0, 1]
            assert span.attributes["corral.gpu.type"] == "sim"
    [step] = [s for name, s in spans.items() if name.startswith(f"step {job}.0")]
    assert step.attributes["corral.step.nodes"] == ["node1", "node2"]
    assert step.attributes["process.exit.code"] == 0
    # One task span per task, under the step, with the pid and exit its node's step supervisor recorded.
    tasks = {name: s for name, s in spans.items() if s.attributes.get("corral.span.kind") == "task"}
    assert set(tasks) == {"task 0 node1", "task 1 node2"}
    for (name, task), node in zip(sorted(tasks.items()), ("node1", "node2"), strict=True):
        assert task.parent_id == step.span_id, name
        assert task.attributes["host.name"] == node and task.attributes["process.exit.code"] == 0
        assert isinstance(task.attributes["process.pid"], int) and task.attributes["process.pid"] > 0
        # its node's clock: after the run started, ended before the step's end was appended (StepStarted
        # is appended once every node's tasks started, so a task may start a little before its step span)
        assert spans["run node1"].start_ns <= task.start_ns <= task.end_ns <= step.end_ns, name
    text = corral(cli, "trace", str(job)).stdout
    assert "task 0 node1" in text and "task 1 node2" in text, text
    assert spans[f"job {job}"].attributes["corral.nodes"] == ["node1", "node2"]
    assert spans[f"job {job}"].attributes["corral.gpu.count"] == 4
    history = audited(cli, job)
    # the batch node reports the start; every node reports its processes' end (issue 10's rule)
    reports = of(history, "run_started") + of(history, "run_exited")
    assert sorted(e["envelope"]["body"]["node"] for e in reports) == ["node1", "node1", "node2"]
    assert all(e["why"][0].startswith("job_allocated") for e in reports)
    assert [e["why"][0].split()[0] for e in of(history, "step_started")] == ["job_allocated"]


def test_an_array_tasks_spans(traced: tuple[LocalCluster, Cli], otlp: OtlpReceiver) -> None:
    _, cli = traced
    first = cli.sbatch("#!/bin/bash\ntrue\n", "--array=3-4")
    for task in (first, first + 1):
        assert cli.wait_state(task, ("COMPLETED",)).startswith("COMPLETED")
    second = derived(otlp, first + 1, done)
    root = second[f"job {first + 1}"].attributes
    assert (root["corral.array.job_id"], root["corral.array.task_id"]) == (first, 4)
    first_spans = derived(otlp, first, done)
    assert first_spans[f"job {first}"].attributes["corral.array.task_id"] == 3
    # One trace and one submit for the whole array.
    assert first_spans[f"job {first}"].parent_id == second[f"job {first + 1}"].parent_id
    # The task's history holds the array's submission (on the array's subject) and its own decisions.
    history = audited(cli, first + 1)
    assert [e["job_id"] for e in of(history, "job_submitted")] == [first]
    assert [e["job_id"] for e in of(history, "job_allocated")] == [first + 1]
    # Slurm's A_T names the same task: the same history, the same trace (the JSON names its own id).
    assert audited(cli, f"{first}_4") == history
    traces = [corral(cli, "trace", name, "--json") for name in (f"{first}_4", str(first + 1))]
    assert [t.returncode for t in traces] == [0, 0], [t.stderr for t in traces]
    by_index, by_id = (json.loads(t.stdout) for t in traces)
    assert by_index["job_id"] == first + 1 and by_index == by_id
    assert "conclude" in corral(cli, "trace", f"{first}_3").stdout
    for command in ("audit", "trace"):
        out = corral(cli, command, f"{first}_5")  # the array has no index 5
        assert (out.returncode, out.stdout) == (1, "")
        assert out.stderr == f"corral {command}: error: Invalid job id specified: no job {first}_5\n"


def test_a_preempted_job_names_its_preemptor(traced: tuple[LocalCluster, Cli], otlp: OtlpReceiver) -> None:
    _, cli = traced
    low = cli.sbatch(
        "#!/bin/bash\n#SBATCH -p low -w node1 --gres=gpu:2\n"
        'if [ "$SLURM_RESTART_COUNT" = 0 ]; then sleep 600; fi\n'
    )
    cli.wait_state(low, ("RUNNING",))
    high = cli.sbatch("#!/bin/bash\n#SBATCH -p high -w node1 --gres=gpu:2\ntrue\n")
    assert cli.wait_state(high, ("COMPLETED",), timeout=60) == "COMPLETED|0:0"
    assert cli.wait_state(low, ("COMPLETED",), timeout=60) == "COMPLETED|0:0"
    spans = derived(otlp, low, done)
    events = dict(spans["attempt 0"].events)
    assert events["preempted"]["corral.preempt.by_job"] == high
    assert events["requeued"]["corral.requeue.reason"] == "Preempted"
    assert events["requeued"]["corral.cause"] == "JobPreempted"
    assert {"attempt 1", "queued 1", "run node1 @1"} <= spans.keys()
    assert spans[f"job {low}"].attributes["corral.job.restart_count"] == 1
    # The preemptor waited for the victim's node: the scheduler logged why (JobReasonChanged).
    waited = derived(otlp, high, done)["queued"].events
    assert ("pending_reason", {"corral.pending.reason": "Resources"}) in waited
    # Its audit names the preemptor as the preemption's cause, and the preemption as the requeue's.
    history = audited(cli, low)
    [preempted] = of(history, "job_preempted")
    assert preempted["why"][0].startswith(f"job_submitted {high}")
    assert of(history, "job_requeued")[0]["why"][0].startswith("job_preempted")


def cycle_spans(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """The scheduler's cycle spans that decided something."""
    return [
        s
        for s in spans
        if s.name == "scheduling cycle" and s.attributes.get("corral.cycle.decisions", 0) not in (0, None)
    ]


def test_the_scheduler_traces_each_cycle_as_a_root_span_of_its_own(
    traced: tuple[LocalCluster, Cli], otlp: OtlpReceiver
) -> None:
    _, cli = traced
    job = cli.sbatch("#!/bin/bash\ntrue\n")
    assert cli.wait_state(job, ("COMPLETED",), timeout=60) == "COMPLETED|0:0"
    cycles = cycle_spans(otlp.wait_for(lambda spans: cycle_spans(spans) != [], timeout=30))
    cycle = cycles[-1]
    assert cycle.service == "corral-scheduler" and cycle.parent_id == ""
    assert {"corral.cycle.jobs_considered", "corral.cycle.reason_changes"} <= cycle.attributes.keys()
    job_traces = {s.trace_id for s in otlp.spans() if s.service == "corral-jobs"}
    assert not {c.trace_id for c in cycles} & job_traces
    # A cycle that appended nothing has no span (its duration is in the metrics' histogram).
    every = [s for s in otlp.spans() if s.name == "scheduling cycle"]
    appended = [
        s.attributes["corral.cycle.decisions"] + s.attributes["corral.cycle.reason_changes"] for s in every
    ]
    assert every and min(appended) > 0, appended


def test_a_job_requeued_after_its_node_is_killed(
    traced: tuple[LocalCluster, Cli], otlp: OtlpReceiver
) -> None:
    cluster, cli = traced
    job = cli.sbatch("#!/bin/bash\n#SBATCH -N2 --gres=gpu:1\nsleep 600\n")
    cli.wait_state(job, ("RUNNING",))
    cluster.kill("agent-node2")
    try:
        cli.wait_state(job, ("PENDING",), timeout=40)
    finally:
        cluster.revive("agent-node2")
    cli.wait_state(job, ("RUNNING",), timeout=60)
    assert cli("scancel", str(job)).returncode == 0
    assert cli.wait_state(job, ("CANCELLED",)).startswith("CANCELLED")
    spans = derived(otlp, job, done)
    first = dict(spans["attempt 0"].events)
    assert first["node_down"]["host.name"] == "node2"
    requeued = first["requeued"]
    assert requeued["corral.requeue.reason"] == "NodeFail"
    assert (requeued["corral.cause"], requeued["corral.cause.node"]) == ("NodeDown", "node2")
    assert spans["run node2"].status == 2  # ended by the node going down
    assert {"attempt 1", "queued 1", "launch node2 @1"} <= spans.keys()
    assert spans["conclude"].attributes["corral.cancelled_by"] == getpass.getuser()
    assert spans[f"job {job}"].attributes["corral.job.restart_count"] == 1
    text = corral(cli, "trace", str(job)).stdout
    [line] = [line for line in text.splitlines() if "· requeued" in line]
    assert "requeue.reason=NodeFail cause=NodeDown" in line and "cause.node=node2" in line, text
    assert "├─ attempt 0" in text and "attempt 1" in text and "queued 1" in text, text


def test_corral_trace_refuses_bad_input(traced: tuple[LocalCluster, Cli]) -> None:
    _, cli = traced
    for bad in ("abc", "12_x", "12_[1-2]"):
        out = corral(cli, "trace", bad)
        assert (out.returncode, out.stderr) == (
            1,
            f"corral trace: error: job id: {bad!r} is not a job id (a job N or an array task A_T, e.g. 12"
            " or 12_3)\n",
        )
    out = corral(cli, "trace", "99999")
    assert (out.returncode, out.stderr) == (
        1,
        "corral trace: error: Invalid job id specified: no job 99999\n",
    )


def corral(cli: Cli, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run the ``corral`` command as the cluster's user."""
    return subprocess.run(
        [str(BIN / "corral"), *argv], env=cli.env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_restart_exports_nothing_twice_and_a_replay_gives_the_same_ids(
    traced: tuple[LocalCluster, Cli], otlp: OtlpReceiver, tmp_path: Path
) -> None:
    cluster, cli = traced
    cluster.restart("tracer")
    job = cli.sbatch("#!/bin/bash\ntrue\n")
    assert cli.wait_state(job, ("COMPLETED",)) == "COMPLETED|0:0"
    derived(otlp, job, done)
    exported = [s for s in otlp.spans() if s.service == "corral-jobs"]
    assert len({s.span_id for s in exported}) == len(exported)
    with Replay(cluster, tmp_path) as again:
        replayed = again.wait_for(lambda spans: len(spans) >= len(exported), timeout=60)

    def key(s: ReceivedSpan) -> tuple[object, ...]:
        return (s.trace_id, s.span_id, s.parent_id, s.name, s.start_ns, s.end_ns)

    assert sorted(map(key, replayed)) == sorted(map(key, exported))


class Replay:
    """A second tracer with a new durable consumer, exporting the whole log again to its own receiver."""

    def __init__(self, cluster: LocalCluster, tmp_path: Path) -> None:
        self.cluster, self.tmp_path = cluster, tmp_path
        self.receivers = otlp_receiver.serve()
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> OtlpReceiver:
        receiver = next(self.receivers)
        env = user_env(self.cluster.state_dir)
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.url
        argv = [
            sys.executable,
            "-m",
            "corral.services.tracer",
            "--credentials",
            str(self.cluster.role_credentials(roles.TRACER)),
            "--config",
            str(self.cluster.config_path),
            "--consumer",
            "tracer-replay",
        ]
        with open(self.tmp_path / "replay.log", "wb") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.1)
        return receiver

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(15)
        self.receivers.close()
