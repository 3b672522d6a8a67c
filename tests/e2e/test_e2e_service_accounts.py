"""Service accounts and external health facts on a whole cluster of real processes.

A CI service account (``corral serviceaccount add ci --submit-for account=ml-platform``) submits with
``sbatch`` for a user of that account (the job is the user's, the service account its recorded actor in
``corral audit``) and is refused for another account, with nothing appended. A DCGM-style exporter
(``--report-health nodes=node1``) reports XID 79 on node1: the node drains with that reason and its
requeueable job is requeued while its ``--no-requeue`` job runs on; its report about node2 (outside its
scope) and a malformed one are dead-lettered on ``corral.dlq.health`` with their reasons, counted, and
change nothing (so is the Python example of ``docs/integrations.md``, run as it is: its node is not in the
scope). The agents' health-check program fails on node2 once a flag file exists: node2 drains.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from agent_cluster import last_seq, wait_until
from e2e_cli import BIN, Cli, admin_cli, as_local, cli_as, user_env
from unix_users import open_directory, unix_users

from corral.cli.local_cluster import LocalCluster, ensure_resolvable, service_account_credentials
from corral.libs.config.cluster import local_config_text
from corral.libs.infra import roles
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import subjects

pytestmark = pytest.mark.e2e

#: The user the CI system submits for: a real Unix user (jobs run as their owner), in both accounts.
OWNER = "saowner"
JOB = "#!/bin/sh\n#SBATCH -t 2:00 --gres=gpu:1\nsleep {seconds}\n"
XID = {
    "node": "node1",
    "source": "dcgm",
    "severity": "fail",
    "checks": [{"kind": "xid", "code": "79", "gpu": 0, "message": "GPU has fallen off the bus"}],
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[LocalCluster, Cli, Path]]:
    """2 nodes x 2 GPUs, the accounts ml-platform and physics, the service accounts ci and dcgm, and a
    health-check program run every second that fails on node2 once ``flag`` exists; in a directory OWNER
    may traverse to their jobs' scripts."""
    with open_directory("corral-sacct-") as root, unix_users((OWNER,), f"{OWNER}-team"):
        yield from _cluster(root)


def _cluster(root: Path) -> Iterator[tuple[LocalCluster, Cli, Path]]:
    """The cluster of ``cluster`` in ``root``."""
    flag = root / "node2-fan-failed"
    check = root / "healthcheck.sh"
    check.write_text(
        f'#!/bin/sh\nif [ "$CORRAL_NODE" = node2 ] && [ -e {flag} ]; then echo "fan 3 failed"; fi\n'
    )
    check.chmod(0o755)
    cluster = LocalCluster(root / "state", getpass.getuser(), nodes=2, gpus_per_node=2)
    cluster.state_dir.mkdir(mode=0o700)
    text = local_config_text("local", ["node1", "node2"], 2, 8, 64 * 1024)
    text = text.replace("node_timeout = 6", 'node_timeout = "0:30"').replace(
        "[cluster]\n",
        f'[cluster]\nhealth_check_program = "{check}"\nhealth_check_interval = 1\n'
        'health_failure_action = "requeue"\n',
    )
    me = getpass.getuser()
    text += (
        f'\n[[accounts]]\nname = "ml-platform"\nusers = ["{OWNER}", "{me}"]\n'
        f'\n[[accounts]]\nname = "physics"\nusers = ["{OWNER}", "{me}"]\n'
    )
    cluster.config_path.write_text(as_local(text))  # the tests' own jobs are root's in CI
    for argv in (
        ["add", "ci", "--submit-for", "account=ml-platform"],
        ["add", "dcgm", "--report-health", "nodes=node1"],
    ):
        out = corral("serviceaccount", "--state-dir", str(cluster.state_dir), *argv)
        assert out.returncode == 0, out.stderr
    config = cluster.prepare()
    assert [sa.name for sa in config.service_accounts] == ["ci", "dcgm"]
    assert ensure_resolvable([n.name for n in config.nodes]) is None
    cluster.start(ready_timeout=90)
    work = root / "work"
    work.mkdir()
    work.chmod(0o777)  # the owner's jobs write their output here
    try:
        yield cluster, Cli(env=user_env(cluster.state_dir), workdir=work), flag
    finally:
        cluster.stop()


def corral(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "corral"), *argv], capture_output=True, text=True, timeout=60, check=False
    )


def ci_cli(cluster: LocalCluster, cli: Cli) -> Cli:
    """The commands as the CI system runs them: its credentials file, submitting for OWNER."""
    ci = cli_as(cli, cluster, service_account_credentials(cluster.state_dir, "ci"))
    ci.env["CORRAL_ON_BEHALF_OF"] = OWNER
    return ci


def report_as_dcgm(cluster: LocalCluster, node: str, data: bytes, subject: str | None = None) -> None:
    """Publish a health report as the dcgm service account, on its own reporter token (or ``subject``)."""

    async def publish() -> None:
        nc = await connect(
            read_credentials(service_account_credentials(cluster.state_dir, "dcgm")), name="dcgm"
        )
        try:
            await nc.publish(subject or subjects.health_report_subject("svc-dcgm", node), data)
            await nc.flush()
        finally:
            await nc.drain()

    asyncio.run(publish())


def dead_letters(cluster: LocalCluster) -> list[tuple[str, str]]:
    """(subject, reason) of every dead letter of health so far."""

    async def read() -> list[tuple[str, str]]:
        nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="test")
        try:
            sub = await nc.jetstream().subscribe(subjects.dlq_subject("health"), ordered_consumer=True)
            out = []
            while True:
                try:
                    msg = await sub.next_msg(timeout=1.0)
                except TimeoutError:
                    return out
                headers = msg.headers or {}
                out.append((headers.get("Corral-Subject", ""), headers.get("Corral-Reason", "")))
        finally:
            await nc.drain()

    return asyncio.run(read())


def doc_example(cluster: LocalCluster) -> str:
    """The Python example of docs/integrations.md ("Reporting a failing GPU"), reading the dcgm service
    account's credentials file."""
    text = (Path(__file__).parents[2] / "docs" / "integrations.md").read_text()
    blocks = [part.split("```", 1)[0] for part in text.split("```python\n")[1:]]
    code = next((b for b in blocks if "/run/secrets/corral-dcgm.json" in b), "")
    assert code, "docs/integrations.md has no Python example reading corral-dcgm.json"
    creds = str(service_account_credentials(cluster.state_dir, "dcgm"))
    return code.replace("/run/secrets/corral-dcgm.json", creds)


def show(cli: Cli, node: str) -> str:
    """``scontrol show node``'s text for ``node``."""
    return cli("scontrol", "show", "node", node).stdout


def test_ci_submits_for_a_user_of_its_account_and_is_refused_for_another(
    cluster: tuple[LocalCluster, Cli, Path],
) -> None:
    local, cli, _ = cluster
    ci = ci_cli(local, cli)
    job = ci.sbatch(JOB.format(seconds=1), "-A", "ml-platform")
    ci.wait_state(job, ("COMPLETED",))
    assert cli.sacct(job, "User,Account,State") == f"{OWNER}|ml-platform|COMPLETED"
    audit = admin_cli(cli, local)("corral", "audit", str(job))
    assert audit.returncode == 0, audit.stderr
    submitted = next(line for line in audit.stdout.splitlines() if "job_submitted" in line)
    assert "svc-ci" in submitted and f"on_behalf_of={OWNER}" in submitted, submitted

    before = last_seq(local, "corral.evt.job.>")
    refused = ci("sbatch", "-A", "physics", stdin=JOB.format(seconds=1))
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (
        "sbatch: error: Batch job submission failed: on_behalf_of: service account 'ci' may not submit for "
        "user 'saowner' into account 'physics': its scope is submit-for account=ml-platform\n"
    )
    assert "Traceback" not in refused.stderr
    # Without naming the user: refused too (a service account owns no jobs).
    del ci.env["CORRAL_ON_BEHALF_OF"]
    alone = ci("sbatch", "-A", "ml-platform", stdin=JOB.format(seconds=1))
    assert alone.returncode == 1 and "submits only on behalf of a user" in alone.stderr
    assert last_seq(local, "corral.evt.job.>") == before


def test_reports_outside_the_scope_or_malformed_are_dead_lettered_and_change_nothing(
    cluster: tuple[LocalCluster, Cli, Path],
) -> None:
    local, cli, _ = cluster
    before = {node: last_seq(local, subjects.node_events(node)) for node in ("node1", "node2")}
    report_as_dcgm(local, "node2", msgspec.json.encode({**XID, "node": "node2"}))
    report_as_dcgm(local, "node1", b'{"node": "node1", "source": "dcgm", "severity": "very bad"}')
    # Nor can it write a drain into the log itself, or report as node1's agent: the server refuses both.
    drained = msgspec.json.encode({"type": "node_drained", "node": "node1", "reason": "x", "by": "svc-dcgm"})
    report_as_dcgm(local, "node1", drained, subjects.node_subject("node1", "node_drained"))
    report_as_dcgm(
        local, "node1", msgspec.json.encode(XID), subjects.health_report_subject("agent-node1", "node1")
    )
    # The documentation's example, as it is: its node gpu003 is not in the scope (nor in the cluster).
    example = subprocess.run(
        [sys.executable, "-c", doc_example(local)], capture_output=True, text=True, timeout=30, check=False
    )
    assert example.returncode == 0, example.stderr
    wait_until(lambda: len(dead_letters(local)) >= 3, 20, "three dead letters")
    letters = dict(dead_letters(local))
    assert "may not report the health of node 'gpu003'" in letters["corral.ext.health.svc-dcgm.gpu003"]
    assert "may not report the health of node 'node2'" in letters["corral.ext.health.svc-dcgm.node2"]
    assert (
        "not a node health report: Invalid enum value 'very bad'"
        in letters["corral.ext.health.svc-dcgm.node1"]
    )
    metrics = urllib.request.urlopen(local.metrics_urls["health"], timeout=5).read().decode()
    assert 'corral_dead_letters_total{reason="rejected",service="health"} 3.0' in metrics
    time.sleep(1)  # anything wrongly appended would be there by now
    assert {node: last_seq(local, subjects.node_events(node)) for node in ("node1", "node2")} == before
    assert "State=IDLE " in show(cli, "node1") and "DRAIN" not in show(cli, "node2")


def test_a_dcgm_report_drains_its_node_and_requeues_the_requeueable_job(
    cluster: tuple[LocalCluster, Cli, Path],
) -> None:
    local, cli, _ = cluster
    requeueable = cli.sbatch(JOB.format(seconds=60), "-w", "node1")
    pinned = cli.sbatch(JOB.format(seconds=60), "-w", "node1", "--no-requeue")
    for job in (requeueable, pinned):
        cli.wait_state(job, ("RUNNING",))
    report_as_dcgm(local, "node1", msgspec.json.encode(XID))
    wait_until(lambda: "Reason=dcgm: xid" in show(cli, "node1"), 20, "node1 drained")
    reason = show(cli, "node1")
    assert "Reason=dcgm: xid 79 gpu 0: GPU has fallen off the bus [svc-dcgm@" in reason, reason
    # The requeueable job is back in the queue (it may not go elsewhere: -w node1); the other runs on.
    wait_until(
        lambda: cli("squeue", "-h", "-j", str(requeueable), "-o", "%T").stdout.strip() == "PENDING",
        30,
        "the requeueable job pending again",
    )
    assert cli("scontrol", "show", "job", str(requeueable)).stdout.count("Restarts=1") == 1
    assert cli("squeue", "-h", "-j", str(pinned), "-o", "%T").stdout.strip() == "RUNNING"
    assert cli("sinfo", "-h", "-n", "node1", "-o", "%t").stdout.strip() == "drng"
    # The same report again drains nothing more (one NodeDrained in node1's history of it).
    seq = last_seq(local, subjects.node_events("node1"))
    report_as_dcgm(local, "node1", msgspec.json.encode(XID))
    time.sleep(1.5)
    assert last_seq(local, subjects.node_events("node1")) == seq
    cli("scancel", str(requeueable), str(pinned))


def test_a_failing_health_check_program_drains_its_node(cluster: tuple[LocalCluster, Cli, Path]) -> None:
    _, cli, flag = cluster
    assert "DRAIN" not in show(cli, "node2")
    flag.touch()
    wait_until(lambda: "fan 3 failed" in show(cli, "node2"), 20, "node2 drained by its health check")
    out = show(cli, "node2")
    assert "Reason=healthcheck: exit 0: fan 3 failed [agent-node2@" in out, out
    os.unlink(flag)
