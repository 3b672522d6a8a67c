"""corral deploy init: what it writes (private credentials naming every NATS server, three clustered NATS
configs, the env file, units, a compose file whose services run the one command line of each), and the
errors for bad input."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from corral.cli.deploy import main
from corral.libs.config.cluster import load_config
from corral.libs.runtime import nats_jwt
from corral.libs.runtime.credentials import read_credentials

pytestmark = pytest.mark.unit


def _init(tmp_path: Path, *extra: str) -> Path:
    target = tmp_path / "deploy"
    assert main(["init", str(target), "--nodes", "gpu[001-003]", "--gpus-per-node", "8", *extra]) == 0
    return target


def test_init_writes_a_whole_deployment(tmp_path: Path) -> None:
    target = _init(tmp_path, "--user", "alice", "--gpu-type", "h100")
    config = load_config(target / "cluster.toml")
    assert [n.name for n in config.nodes] == ["gpu001", "gpu002", "gpu003"]
    assert {n.gpus for n in config.nodes} == {8}
    creds = read_credentials(target / "credentials" / "roles" / "agent-gpu002.json")
    assert creds.url == "nats://nats-1:4222,nats://nats-2:4223,nats://nats-3:4224"
    assert read_credentials(target / "credentials" / "alice.json").user == "alice"
    for secret in [*target.glob("credentials/**/*.json"), *target.glob("nats/*.conf"), target / "env"]:
        assert stat.S_IMODE(secret.stat().st_mode) & 0o077 == 0, secret  # nothing world- or group-readable
    conf = (target / "nats" / "nats-2.conf").read_text()
    assert 'listen: "0.0.0.0:4223"' in conf and '"nats-route://nats-3:6224"' in conf
    assert creds.password in conf  # the agent's login, with its permissions
    env = dict(line.split("=", 1) for line in (target / "env").read_text().splitlines())
    assert env["CORRAL_DATABASE_URL"].startswith("postgresql://corral:") and env["POSTGRES_PASSWORD"]
    assert env["POSTGRES_PASSWORD"] in env["CORRAL_DATABASE_URL"]
    compose = yaml.safe_load((target / "compose.yaml").read_text())["services"]
    assert {"nats-1", "nats-2", "nats-3", "postgres", "declare", "gateway", "scheduler"} <= compose.keys()
    assert {"agent-gpu001", "agent-gpu002", "agent-gpu003"} <= compose.keys()
    assert "tracer" not in compose  # no OTLP endpoint given
    assert compose["declare"]["command"][-2:] == ["--replicas", "3"]
    # Nothing is installed at start and the deployment is only ever mounted read-only.
    assert compose["nats-1"]["build"]["dockerfile"] == "infra/Dockerfile"
    for name, service in compose.items():
        assert "pip" not in " ".join(service["command"]), name
        assert all(v.endswith(":ro") for v in service.get("volumes", []) if v.startswith(".")), name
    unit = (target / "systemd" / "corral-scheduler.service").read_text()
    assert "ExecStart=/opt/corral/venv/bin/python -m corral.services.scheduler" in unit
    assert " ".join(compose["scheduler"]["command"][1:]) in unit  # the same command line


def test_init_writes_the_identity_pieces(tmp_path: Path) -> None:
    target = _init(tmp_path)
    for secret in (target / "auth" / "ticket.key", target / "auth" / "issuer.nk"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    issuer = nats_jwt.public_key((target / "auth" / "issuer.nk").read_bytes().strip())
    system = read_credentials(target / "credentials" / "roles" / "corral-system.json")
    for conf in target.glob("nats/*.conf"):
        text = conf.read_text()
        assert f'issuer: "{issuer}"' in text and "system_account: SYS" in text, conf
        assert system.password in text and '"corral-gateway"' in text.split("auth_users:")[1], conf
    authd = (target / "systemd" / "corral-authd.service").read_text()
    assert (
        "User=root" in authd and "--socket /run/corral/authd.sock --key /etc/corral/auth/ticket.key" in authd
    )
    auth = (target / "systemd" / "corral-auth.service").read_text()
    assert "User=root" in auth and "--ticket-key /etc/corral/auth/ticket.key" in auth


def test_an_otlp_endpoint_adds_the_tracer(tmp_path: Path) -> None:
    target = _init(tmp_path, "--otlp", "http://collector:4318")
    compose = yaml.safe_load((target / "compose.yaml").read_text())["services"]
    assert "tracer" in compose
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318" in (target / "env").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "gpu[001-"], "--nodes"),
        (["--nodes", "gpu1", "--nats-hosts", "a,b"], "--nats-hosts names 2 servers; it needs 3"),
        (["--nodes", "gpu1", "--postgres", "postgres"], "--postgres 'postgres' is not host:port"),
    ],
)
def test_bad_input_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["init", str(tmp_path / "d"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_a_directory_that_holds_a_deployment_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _init(tmp_path)
    before = (target / "env").read_text()
    assert main(["init", str(target), "--nodes", "gpu1"]) == 1
    assert "already holds a deployment" in capsys.readouterr().err
    assert (target / "env").read_text() == before
