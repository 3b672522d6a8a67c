"""``corral audit`` against a cluster of real processes: a job's history says who did what and why, the
causes of the agents' and health's facts included; a user may not read another's, the auditor reads all and
changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import getpass
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_cli import Cli, cli_as, guest_cluster, user_env

from corral.cli.local_cluster import LocalCluster
from corral.libs.infra import roles
from corral.libs.runtime.credentials import read_credentials

pytestmark = pytest.mark.e2e

#: A second user of the cluster (identity comes from NATS credentials until it comes from the OS); no Unix
#: user of that name exists, so their jobs fail to launch ("Invalid user id").
GUEST = "mallory"
SLEEPER = "#!/bin/bash\n#SBATCH -N 2 --gres=gpu:1 -o /dev/null\nsleep 600\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 2-node cluster of our own (this module kills an agent), with a guest user."""
    with guest_cluster(tmp_path_factory.mktemp("audit"), 2, (GUEST,)) as cluster:
        yield cluster


@pytest.fixture
def cli(cluster: LocalCluster, tmp_path: Path) -> Cli:
    """The commands as the cluster's user."""
    return Cli(env=user_env(cluster.state_dir), workdir=tmp_path)


def audit(cli: Cli, *args: str) -> list[dict[str, Any]]:
    """``corral audit --json``'s entries."""
    out = cli("corral", "audit", "--json", *args)
    assert out.returncode == 0, out.stderr
    entries: list[dict[str, Any]] = json.loads(out.stdout)["entries"]
    return entries


def wait_for(what: str, check: Any, timeout: float = 40.0) -> Any:
    """Poll ``check`` until it returns something true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.3)
    raise AssertionError(f"{what}: not in {timeout}s")


def test_a_job_requeued_after_its_node_was_killed_says_why_and_a_cancel_says_who(
    cluster: LocalCluster, cli: Cli
) -> None:
    job = cli.sbatch(SLEEPER)
    cli.wait_state(job, ("RUNNING",))
    wait_for("RunStarted", lambda: any(e["event"] == "run_started" for e in audit(cli, str(job))))
    cluster.kill("agent-node2")  # node2 stops heartbeating; the batch script runs on node1
    try:
        requeued = wait_for(
            "the requeue",
            lambda: [e for e in audit(cli, str(job)) if e["event"] == "job_requeued"],
        )
    finally:
        cluster.revive("agent-node2")
    assert requeued[0]["why"] == ["node_down node2 (Not responding)", "missed heartbeats"]
    text = cli("corral", "audit", str(job)).stdout
    assert "job_requeued" in text and "← node_down node2 (Not responding)  ← missed heartbeats" in text
    # Health's NodeDown names no cause (missed heartbeats are not in the log) ...
    auditor = cli_as(cli, cluster, cluster.role_credentials(roles.AUDITOR))
    down = [e for e in audit(auditor, "--node", "node2") if e["event"] == "node_down"]
    assert down and all(e["envelope"]["meta"]["causation_id"] is None for e in down)
    assert down[-1]["what"] == {"node": "node2", "reason": "Not responding"}
    # ... and the agent's facts name the run's allocation.
    entries = audit(cli, str(job))
    by_id = {e["envelope"]["meta"]["event_id"]: e for e in entries}
    started = [e for e in entries if e["event"] == "run_started"]
    assert started and all(
        by_id[e["envelope"]["meta"]["causation_id"]]["event"] == "job_allocated" for e in started
    )
    cli.wait_state(job, ("RUNNING",), timeout=60)  # node2 is back: attempt 1
    assert cli("scancel", str(job)).returncode == 0
    cli.wait_state(job, ("CANCELLED",))
    # Every fact an agent reported (node2's too, once revived) names the allocation of its run.
    entries = audit(cli, str(job))
    by_id = {e["envelope"]["meta"]["event_id"]: e["envelope"]["body"] for e in entries}
    facts = [e["envelope"] for e in entries if e["actor"].startswith("agent-")]
    assert {f["body"]["type"] for f in facts} >= {"run_started", "run_exited"}
    for fact in facts:
        allocation = by_id[fact["meta"]["causation_id"]]
        assert (allocation["type"], allocation["attempt"]) == ("job_allocated", fact["body"]["attempt"])
    user = getpass.getuser()
    cancelled = wait_for(
        "the cancel", lambda: [e for e in audit(cli, str(job)) if e["event"] == "job_cancelled"]
    )
    assert cancelled[-1]["why"] == [f"job_cancel_requested by {user}"]
    requested = [e for e in audit(cli, str(job)) if e["event"] == "job_cancel_requested"]
    assert [e["actor"] for e in requested] == [user]


def test_a_user_auditing_another_users_job_is_refused(cluster: LocalCluster, cli: Cli) -> None:
    job = cli.sbatch("#!/bin/bash\n#SBATCH -o /dev/null\ntrue\n")
    guest = cli_as(cli, cluster, cluster.credentials_of(GUEST))
    refused = guest("corral", "audit", str(job))
    assert refused.returncode == 1 and refused.stdout == ""
    assert f"job {job} belongs to {getpass.getuser()}, not {GUEST}" in refused.stderr
    assert "a user may read only their own jobs' history" in refused.stderr
    for other in (["--user", getpass.getuser()], ["--node", "node1"]):
        assert guest("corral", "audit", *other).returncode == 1
    # corral trace reads the same history: refused alike
    traced = guest("corral", "trace", str(job))
    assert (
        traced.returncode == 1 and f"job {job} belongs to {getpass.getuser()}, not {GUEST}" in traced.stderr
    )
    own = guest.sbatch("#!/bin/bash\n#SBATCH -o /dev/null\ntrue\n")
    assert audit(guest, str(own))[0]["actor"] == GUEST
    # the guest has no Unix account on the nodes, so their job runs nothing (jobs run as their owner)
    cli.wait_state(own, ("FAILED",))
    mine = guest("corral", "trace", str(own), "--json")
    assert mine.returncode == 0, mine.stderr
    assert "conclude" in {span["name"] for span in json.loads(mine.stdout)["spans"]}


def test_the_auditor_reads_every_history_and_cannot_cancel(cluster: LocalCluster, cli: Cli) -> None:
    job = cli.sbatch(SLEEPER)
    cli.wait_state(job, ("RUNNING",))
    auditor = cli_as(cli, cluster, cluster.role_credentials(roles.AUDITOR))
    assert audit(auditor, str(job))[0]["event"] == "job_submitted"
    assert any(e["job_id"] == job for e in audit(auditor, "--user", getpass.getuser()))
    node = [e["event"] for e in audit(auditor, "--node", "node1")]
    assert "node_registered" in node and "job_allocated" in node
    refused = auditor("scancel", str(job))
    assert refused.returncode != 0 and "auditor role, which is read-only" in refused.stderr
    assert cli.sacct(job).startswith("RUNNING")
    assert cli("scancel", str(job)).returncode == 0
    cli.wait_state(job, ("CANCELLED",))


#: What a guest may try, with its NATS credentials, to read another user's submission: the log, the launch
#: orders, the job-id counter and snapshot buckets, the stream API (direct and message gets, a consumer).
RAW_READS = (
    ("sub", ">"),
    ("sub", "corral.evt.>"),
    ("sub", "corral.work.>"),
    ("sub", "$KV.>"),
    ("req", "$JS.API.DIRECT.GET.CORRAL_EVENTS"),
    ("req", "$JS.API.STREAM.MSG.GET.CORRAL_EVENTS"),
    ("req", "$JS.API.STREAM.MSG.GET.CORRAL_WORK"),
    ("req", "$JS.API.CONSUMER.CREATE.CORRAL_EVENTS"),
    ("req", "$JS.API.CONSUMER.CREATE.CORRAL_WORK"),
    ("req", "$JS.API.STREAM.INFO.CORRAL_EVENTS"),
)


async def raw_reads(cluster: LocalCluster, job: int) -> tuple[list[str], bytes]:
    """Every raw read of ``RAW_READS`` as the guest: the server's refusals and every byte that came back."""
    import nats

    creds = read_credentials(cluster.credentials_of(GUEST))
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error).lower())

    assert cluster.nats is not None
    nc = await nats.connect(
        cluster.nats.url,
        user=creds.user,
        password=creds.password,
        error_cb=on_error,
        inbox_prefix=f"_INBOX.{GUEST}".encode(),
    )
    got = b""
    try:
        subs = []
        for kind, subject in RAW_READS:
            if kind == "sub":
                subs.append(await nc.subscribe(subject))
                continue
            body = json.dumps({"last_by_subj": f"corral.evt.job.{job}.job_submitted"}).encode()
            try:
                got += (await nc.request(subject, body, timeout=1)).data
            except Exception as exc:  # refused: nothing comes back (no responders, or a timeout)
                errors.append(f"request {subject}: {type(exc).__name__}")
        await nc.flush()
        await asyncio.sleep(1.0)
        for sub in subs:
            while sub.pending_msgs:
                got += (await sub.next_msg(timeout=1)).data
    finally:
        await nc.close()
    return errors, got


def test_a_guest_finds_no_trace_of_another_users_script_or_environment(
    cluster: LocalCluster, cli: Cli
) -> None:
    secret_script, secret_env = f"SCRIPT-{uuid.uuid4().hex}", f"ENV-{uuid.uuid4().hex}"
    env = {**cli.env, "CORRAL_TEST_SECRET": secret_env}
    owner = dataclasses.replace(cli, env=env)
    job = owner.sbatch(f"#!/bin/bash\n#SBATCH -o /dev/null\n# {secret_script}\nsleep 600\n")
    try:
        cli.wait_state(job, ("RUNNING",))
        guest = cli_as(cli, cluster, cluster.credentials_of(GUEST))
        shown = [
            guest("squeue", "-j", str(job), "-o", "%i %j %u %o %Z %k"),
            guest("scontrol", "show", "job", str(job)),
            guest("sacct", "-j", str(job), "--json"),
            guest("sacct", "-j", str(job), "-P", "-o", "JobID,JobName,SubmitLine,WorkDir,Comment"),
            guest("corral", "audit", "--json", str(job)),
            guest("corral", "trace", "--json", str(job)),
        ]
        assert shown[1].returncode == 0 and str(job) in shown[1].stdout  # the job is visible, its data not
        for out in shown:
            assert secret_script not in out.stdout + out.stderr and secret_env not in out.stdout + out.stderr
        errors, got = asyncio.run(raw_reads(cluster, job))
        assert secret_script.encode() not in got and secret_env.encode() not in got
        for kind, subject in RAW_READS:  # each refused by the server itself
            what = "subscription" if kind == "sub" else "publish"
            assert any(f'violation for {what} to "{subject.lower()}"' in e for e in errors), (subject, errors)
        # the owner's own history holds both
        mine = cli("corral", "audit", "--json", str(job)).stdout
        assert secret_script in mine and secret_env in mine
    finally:
        cli("scancel", str(job))
