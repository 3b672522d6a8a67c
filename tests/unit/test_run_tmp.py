"""Each run's private TMPDIR on a node (``runtmp.py``): made the job owner's (0700) under the agent's own
directory, never in a directory someone else made; removed with what the job left, once the run ended on
the node (before the node reports it); swept after an agent restart; and ``[cluster] tmpdir_base``."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest
from test_agent_work import launch_order, node, settle

from corral.libs.config.cluster import ConfigError, parse_config
from corral.libs.runtime import telemetry
from corral.schemas import api
from corral.services.agent import runtmp
from corral.services.agent.identity import JobUser
from corral.services.agent.jobenv import NodeEnv
from corral.services.agent.records import Record, Records
from corral.services.agent.runtmp import RunTmp
from corral.services.agent.work import Work

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

LOG = telemetry.logger(node="gpu01")
#: a job owner other than the agent (root in CI): what the agent hands the directory to
OWNER = JobUser("alice", 4321, 4322, (4322,), "/home/alice", "/bin/bash", switch=os.geteuid() == 0)


def tmp_of(tmp_path: Path, records: Records | None = None) -> RunTmp:
    records = records or Records(tmp_path / "state" / "runs.jsonl")
    return RunTmp(tmp_path / "base", "local-abc", "gpu01", records, LOG, NodeEnv(conf="/c.toml"))


def test_a_runs_tmpdir_is_its_owners_alone(tmp_path: Path) -> None:
    tmp = tmp_of(tmp_path)
    env = tmp.node_env(42, 1, OWNER)
    path = tmp_path / "base" / "corral-local-abc-gpu01" / "42.1"
    assert (env.tmpdir, env.conf) == (str(path), "/c.toml")
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o700
    if OWNER.switch:
        assert (info.st_uid, info.st_gid) == (OWNER.uid, OWNER.gid)
    # the agent's directory: owners reach their own run's, nobody lists them
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o711
    assert tmp.make(42, 1, OWNER) == str(path)  # a second step's: the same one


@pytest.mark.parametrize("planted", ["open-directory", "symlink"], ids=["open-directory", "symlink"])
def test_a_directory_someone_else_made_first_is_not_used(tmp_path: Path, planted: str) -> None:
    """In a shared /tmp a user could make the agent's directory's name first: the run gets /tmp."""
    root = tmp_path / "base" / "corral-local-abc-gpu01"
    root.parent.mkdir()
    if planted == "symlink":
        (tmp_path / "elsewhere").mkdir()
        root.symlink_to(tmp_path / "elsewhere")
    else:
        root.mkdir()
        root.chmod(0o777)
    assert tmp_of(tmp_path).make(42, 0, OWNER) == "/tmp"
    assert not (tmp_path / "elsewhere" / "42.0").exists()


def test_removal_takes_what_the_job_left_and_follows_no_link(tmp_path: Path) -> None:
    tmp = tmp_of(tmp_path)
    path = Path(tmp.make(7, 0, OWNER))
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "data").write_text("mine")
    (path / "deep" / "er").mkdir(parents=True)
    (path / "deep" / "er" / "f").write_text("x")
    (path / "link").symlink_to(keep)
    (path / "deep").chmod(0o500)  # closed by the job to itself
    tmp.remove(7, 0)
    assert not path.exists() and (keep / "data").read_text() == "mine"
    tmp.remove(7, 0)  # nothing left: nothing to do


def test_a_run_that_ended_here_gets_no_new_one(tmp_path: Path) -> None:
    records = Records(tmp_path / "runs.jsonl")
    records.put(Record(job_id=7, attempt=0, exited=True))
    assert tmp_of(tmp_path, records).make(7, 0, OWNER) == "/tmp"


def test_a_restarted_agent_sweeps_the_tmpdirs_of_runs_that_are_gone(tmp_path: Path) -> None:
    records = Records(tmp_path / "runs.jsonl")
    tmp = tmp_of(tmp_path, records)
    for job, attempt in ((1, 0), (2, 0), (3, 0), (3, 1), (4, 0)):
        tmp.make(job, attempt, OWNER)
    records.put(Record(job_id=1, attempt=0, exited=True))  # reported ended
    records.put(Record(job_id=2, attempt=0))  # still running (adopted)
    records.put(Record(job_id=3, attempt=1))  # 3.0 is an older attempt
    state = tmp_path / "state"
    state.mkdir()
    tmp.sweep(state)
    assert sorted(os.listdir(tmp.root)) == ["2.0", "3.1", "4.0"]  # 4.0: a peer's live run, known by no record
    assert (state / runtmp.MARKER).read_text().strip() == str(tmp.root)
    runtmp.remove_all(state)  # corral up's stop
    assert tmp.root is not None and not tmp.root.exists()


def test_no_base_no_tmpdir(tmp_path: Path) -> None:
    tmp = RunTmp(None, "t", "gpu01", Records(tmp_path / "r.jsonl"), LOG)
    assert tmp.node_env(1, 0, OWNER) == NodeEnv() and tmp.path(1, 0) is None


# --- the agent's runs ---------------------------------------------------------------------------------


def with_tmp(work: Work, tmp_path: Path) -> RunTmp:
    work.tmp = RunTmp(tmp_path / "base", "t", work.node, work.runs.records, LOG)
    return work.tmp


async def test_a_peer_removes_the_runs_tmpdir_before_it_reports_the_run_gone(tmp_path: Path) -> None:
    peer = node(tmp_path)
    tmp = with_tmp(peer.work, tmp_path)
    path = Path(tmp.make(7, 0, OWNER))  # as the run's first step here made it
    await peer.work.kill(api.KillOrder(job_id=7, attempt=0, node="gpu02", reason="requeue"))
    await settle()
    assert path.exists() and peer.exits() == []  # its tasks may still use it
    peer.steps.gone.set()
    for _ in range(200):
        if peer.exits():
            break
        await asyncio.sleep(0.01)
    assert len(peer.exits()) == 1 and not path.exists()


async def test_a_launch_that_fails_leaves_no_tmpdir(tmp_path: Path) -> None:
    batch = node(tmp_path, "gpu01")
    tmp = with_tmp(batch.work, tmp_path)
    batch.steps.gone.set()
    await batch.work.launch(launch_order(job_id=8, attempt=0, workdir=str(tmp_path / "missing")))
    (exit,) = batch.exits()
    assert exit.launch_error and tmp.root is not None and os.listdir(tmp.root) == []


# --- [cluster] tmpdir_base ------------------------------------------------------------------------------

NODES = '[[nodes]]\nnames = "n1"\ncpus = 2\nmemory = "1G"\n\n[[partitions]]\nname = "p"\nnodes = "n1"\n'


@pytest.mark.parametrize(
    ("line", "base"),
    [("", "/tmp"), ('tmpdir_base = "/scratch/jobs"', "/scratch/jobs"), ('tmpdir_base = ""', "")],
)
def test_tmpdir_base_setting(line: str, base: str) -> None:
    assert parse_config(f"[cluster]\n{line}\n{NODES}").tmpdir_base == base


def test_a_relative_tmpdir_base_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.tmpdir_base: 'tmp' is not an absolute path"):
        parse_config(f'[cluster]\ntmpdir_base = "tmp"\n{NODES}')
