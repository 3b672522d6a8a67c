"""The compose topology, without Docker: ``corral deploy init`` writes a deployment; this test reads its
``compose.yaml`` and starts every service in it as a local process, with the file's commands, environment
and config files (the deployment directory where compose mounts it, a directory per service where its
volume is): three clustered NATS servers, the one-shot declaration at 3 replicas, PostgreSQL, every
service and two agents. A job then runs end to end, and again with one NATS server killed.

PostgreSQL is the exception: compose runs the official image, which cannot run here; the test starts the
pip-installed PostgreSQL with the user, password and database the deployment's ``env`` gives that image."""

from __future__ import annotations

import asyncio
import getpass
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_cli import BIN, Cli, as_local, user_env

from corral.cli import deploy_compose
from corral.cli.local_cluster import ensure_resolvable
from corral.libs.infra.managed import port_is_free
from corral.libs.infra.nats_server import nats_server_binary
from corral.libs.infra.postgres_server import PostgresServer
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import subjects

pytestmark = pytest.mark.e2e

ROOT = "/etc/corral"
WORKDIR = "/var/lib/corral"


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports."""
    for _ in range(200):
        base = random.randrange(20000, 60000)
        if all(port_is_free(base + i, "127.0.0.1") for i in range(count)):
            return base
    raise AssertionError("no run of free ports")


def local_argv(argv: list[str]) -> list[str]:
    """A compose command as a local one: the image's programs are this environment's."""
    program = {
        "python": sys.executable,
        "nats-server": str(nats_server_binary()),
        "corral": str(BIN / "corral"),
    }
    return [program.get(argv[0], argv[0]), *argv[1:]]


def mounted(value: str, deploy: Path) -> str:
    """A path as compose mounts it (``.:/etc/corral:ro``) turned into the deployment directory."""
    return value.replace(ROOT, str(deploy))


class Topology:
    """The processes of a compose file, started locally."""

    def __init__(self, deploy: Path, work: Path) -> None:
        self.deploy = deploy
        self.work = work
        self.compose = yaml.safe_load((deploy / "compose.yaml").read_text())
        self.env_file = dict(
            line.split("=", 1) for line in (deploy / "env").read_text().splitlines() if "=" in line
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.postgres: PostgresServer | None = None

    def service(self, name: str) -> dict:  # type: ignore[type-arg]
        return self.compose["services"][name]

    def start(self, name: str) -> subprocess.Popen[bytes]:
        """Start one service of the compose file: its command, env_file and environment, in its volume."""
        spec = self.service(name)
        for volume in spec["volumes"]:
            assert volume.split(":")[0] in (".",) or volume.split(":")[1] == WORKDIR, volume
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CORRAL_", "OTEL_"))}
        env.update({k: mounted(v, self.deploy) for k, v in self.env_file.items()})
        env.update({k: mounted(str(v), self.deploy) for k, v in spec.get("environment", {}).items()})
        cwd = self.work / name
        cwd.mkdir(exist_ok=True)
        argv = local_argv([mounted(a, self.deploy) for a in spec["command"]])
        with (self.work / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs[name] = proc
        return proc

    def start_postgres(self) -> None:
        """PostgreSQL with the deployment's user, password and database (what the image's env sets)."""
        service = self.compose["services"]
        name = next(n for n, s in service.items() if s.get("image", "").startswith("postgres"))
        port = int(service[name]["command"][service[name]["command"].index("-p") + 1])
        data = self.work / name
        data.mkdir()
        assert self.env_file["POSTGRES_USER"] == PostgresServer.USER == self.env_file["POSTGRES_DB"]
        (data / "password").write_text(self.env_file["POSTGRES_PASSWORD"] + "\n")
        os.chmod(data / "password", 0o600)
        self.postgres = PostgresServer(data, port=port)
        self.postgres.start()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.postgres is not None:
            self.postgres.stop()


@pytest.fixture
def topology(tmp_path: Path) -> Iterator[tuple[Topology, Cli]]:
    deploy, work = tmp_path / "deploy", tmp_path / "work"
    work.mkdir()
    # metrics: one port per service of deploy_compose.SERVICES and per agent, checked free
    metrics = free_ports(len(deploy_compose.SERVICES) + 2)
    nats, routes, pg = free_ports(3), free_ports(3), free_ports(1)
    hosts = ["corral-t-nats-1", "corral-t-nats-2", "corral-t-nats-3"]
    nodes = ["cnode1", "cnode2"]
    assert ensure_resolvable([*hosts, "corral-t-postgres", *nodes]) is None
    init = subprocess.run(
        [str(BIN / "corral"), "deploy", "init", str(deploy), "--nodes", "cnode[1-2]", "--gpus-per-node", "2",
         "--cpus-per-node", "8", "--memory-per-node", "8192", "--nats-hosts", ",".join(hosts),
         "--nats-port", str(nats), "--route-port", str(routes), "--postgres", f"corral-t-postgres:{pg}",
         "--metrics-port", str(metrics), "--user", getpass.getuser()],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    config = deploy / "cluster.toml"
    assert "allow_root_jobs" not in config.read_text()  # a deployment refuses root's jobs
    config.write_text(as_local(config.read_text()))  # the test's user is root in CI
    top = Topology(deploy, work)
    # The commands' state: the deployment directory (credentials/<user>.json); a command server of their own.
    env = user_env(deploy)
    (tmp_path / "runtime").mkdir(mode=0o700)
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "runtime")
    try:
        yield top, Cli(env=env, workdir=work)
    finally:
        top.stop()
        print("\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in work.glob("*.log")))


def replicas(deploy: Path) -> int:
    async def info() -> int:
        nc = await connect(read_credentials(deploy / "credentials" / "roles" / "corral-admin.json"), name="t")
        try:
            return (await nc.jetstream().stream_info(subjects.EVENTS_STREAM)).config.num_replicas or 1
        finally:
            await nc.close()

    return asyncio.run(info())


def test_the_compose_topology_runs_a_job_end_to_end(topology: tuple[Topology, Cli]) -> None:
    top, cli = topology
    services = top.compose["services"]
    nats = [n for n, s in services.items() if s["command"][0] == "nats-server"]
    assert len(nats) == 3
    for name in nats:
        top.start(name)
    top.start_postgres()
    # The one-shot declaration: compose restarts it on failure until the JetStream cluster has a leader.
    deadline = time.monotonic() + 60
    while top.start("declare").wait(60) != 0:
        assert time.monotonic() < deadline, (top.work / "declare.log").read_text()
        time.sleep(1)
    assert replicas(top.deploy) == 3
    for name, spec in services.items():
        if spec["command"][0] == "python":
            top.start(name)
    assert {n for n in services if n.startswith("agent-")} == {"agent-cnode1", "agent-cnode2"}
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        out = cli("sinfo", "-h", "-o", "%T %D")
        if out.returncode == 0 and out.stdout.lower().split() == ["idle", "2"]:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"the nodes did not register: {out.stdout} {out.stderr}")
    job = cli.sbatch("#!/bin/bash\nhostname\n", "-N", "2", "--gres=gpu:1")
    assert cli.wait_state(job, ("COMPLETED",), timeout=90) == "COMPLETED|0:0"
    # One NATS server of three is lost: the clients fail over and the streams keep a quorum.
    top.procs[nats[0]].kill()
    top.procs[nats[0]].wait()
    # A submit during the failover (a stream's leader may have been on the lost server) may be refused;
    # within seconds one is accepted, and its job runs.
    deadline = time.monotonic() + 60
    while (out := cli("sbatch", "--parsable", "--gres=gpu:1", stdin="#!/bin/bash\ntrue\n")).returncode:
        assert time.monotonic() < deadline, out.stderr
        time.sleep(1)
    assert cli.wait_state(int(out.stdout), ("COMPLETED",), timeout=90) == "COMPLETED|0:0"
    # The job of before the loss is still in the log and in accounting.
    assert cli.sacct(job) == "COMPLETED|0:0"
