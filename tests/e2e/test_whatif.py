"""What-if on a real cluster: export the log, replay it under fifo and easy; sprio, sshare, Priority=."""

from __future__ import annotations

import csv
import json
import re
import time
from pathlib import Path

import pytest
from e2e_cli import Cli

from corral.cli.local_cluster import LocalCluster
from corral.libs.infra import roles
from corral.libs.runtime.credentials import read_credentials

pytestmark = pytest.mark.e2e


def admin_cli(cli: Cli, cluster: LocalCluster) -> Cli:
    """The commands as the admin role (a remote cluster through the environment)."""
    creds = cluster.role_credentials(roles.ADMIN)
    env = dict(cli.env) | {"CORRAL_NATS_URL": read_credentials(creds).url, "CORRAL_CREDENTIALS": str(creds)}
    return Cli(env=env, workdir=cli.workdir)


def test_export_the_log_and_replay_it_under_fifo_and_easy(
    cli: Cli, local_cluster: LocalCluster, tmp_path: Path
) -> None:
    jobs = [cli.sbatch("#!/bin/sh\nsleep 1\n", "--gres=gpu:4", "-t", "5") for _ in range(3)]
    for job_id in jobs:
        cli.wait_state(job_id, ("COMPLETED",), timeout=60)
    out = cli("corral", "log", "export", "--out", str(tmp_path / "log.jsonl"))
    assert out.returncode == 0, out.stderr
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert re.search(rf"{len(lines)} entries \(up to sequence \d+\) written", out.stderr), out.stderr
    seqs = [json.loads(line)["seq"] for line in lines]
    assert seqs == sorted(seqs) and len(seqs) > 3 * 4  # submit, allocate, start, exit, complete each
    tags = {json.loads(line)["envelope"]["body"]["type"] for line in lines}
    assert {"node_registered", "job_submitted", "job_allocated", "run_exited", "job_completed"} <= tags

    results = {}
    for policy, extra in (("fifo", []), ("easy", ["--config", str(local_cluster.config_path)])):
        starts = tmp_path / f"{policy}.csv"
        sim = cli(
            "corral", "sim", str(tmp_path / "log.jsonl"), "--policy", policy, "--starts", str(starts), *extra
        )
        assert sim.returncode == 0, sim.stderr
        table = [row.split() for row in sim.stdout.splitlines()]
        assert table[0] == [policy, "actual"], sim.stdout
        jobs_row = next(row for row in table if row[0] == "jobs")
        assert jobs_row[1] == jobs_row[2] and int(jobs_row[1]) >= 3
        with starts.open() as fh:
            rows = {int(r["id"]): r for r in csv.DictReader(fh)}
        assert set(jobs) <= set(rows)
        # Each replayed run lasts as long as the real one held its GPUs (>= the script's 1 s).
        for job_id in jobs:
            assert float(rows[job_id]["end"]) - float(rows[job_id]["start"]) >= 1.0
        results[policy] = rows
    # Three 4-GPU jobs on 8 GPUs: both policies run the same schedule for them.
    assert {j: results["fifo"][j]["start"] for j in jobs} == {j: results["easy"][j]["start"] for j in jobs}

    # The user's own credentials may not read the log: the command says which file it needs.
    env = dict(cli.env) | {"CORRAL_STATE_DIR": str(tmp_path / "nothing")}
    refused = Cli(env=env, workdir=cli.workdir)("corral", "log", "export")
    assert refused.returncode == 1 and "corral-admin.json" in refused.stderr


def test_admin_sets_a_priority_that_squeue_and_sprio_show_and_priority_zero_holds(
    cli: Cli, local_cluster: LocalCluster
) -> None:
    admin = admin_cli(cli, local_cluster)
    job = cli.sbatch("#!/bin/sh\ntrue\n", "--begin=now+3600")  # pending (BeginTime), not held
    try:
        denied = cli("scontrol", "update", f"JobId={job}", "Priority=5")
        assert denied.returncode == 1 and "Access/permission denied" in denied.stderr
        set_ = admin("scontrol", "update", f"JobId={job}", "Priority=5000")
        assert set_.returncode == 0, set_.stderr
        deadline = time.monotonic() + 30
        shown = ""
        while time.monotonic() < deadline and shown != "5000":
            time.sleep(0.3)
            shown = cli("squeue", "-j", str(job), "-h", "-o", "%Q").stdout.strip()
        assert shown == "5000"
        sprio = cli("sprio", "-j", str(job))
        assert sprio.returncode == 0, sprio.stderr
        header, row = sprio.stdout.splitlines()
        assert header.split()[:4] == ["JOBID", "PARTITION", "USER", "PRIORITY"]
        assert row.split()[0] == str(job) and row.split()[3] == "5000"
        assert admin("scontrol", "update", f"JobId={job}", "Priority=0").returncode == 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "JobHeldAdmin" not in shown:
            time.sleep(0.3)
            shown = cli("squeue", "-j", str(job), "-h", "-o", "%Q %r").stdout.strip()
        assert shown == "0 JobHeldAdmin"
    finally:
        cli("scancel", str(job))


def test_sshare_shows_the_users_association_with_usage(cli: Cli, local_cluster: LocalCluster) -> None:
    job = cli.sbatch("#!/bin/sh\nsleep 1\n", "--gres=gpu:1")
    cli.wait_state(job, ("COMPLETED",), timeout=60)
    out = cli("sshare", "-P", "-n", "-l")
    assert out.returncode == 0, out.stderr
    rows = [line.split("|") for line in out.stdout.splitlines()]
    assert rows[0][0] == "root"
    mine = [r for r in rows if r[1] == local_cluster.user]
    assert len(mine) == 1 and int(mine[0][4]) >= 1  # GPU-seconds used
    assert 0.0 < float(mine[0][6]) <= 1.0  # its fair-share factor
