"""Bad input: a clear one-line error naming the problem, a non-zero exit, nothing in the log, no crash."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from e2e_cli import Cli

from corral.cli.local_cluster import LocalCluster
from corral.libs.infra import roles
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.nats_request import request
from corral.schemas import subjects

pytestmark = pytest.mark.e2e


def log_last_seq(cluster: LocalCluster) -> int:
    """The log's newest sequence, read as the admin role."""
    creds = read_credentials(cluster.role_credentials(roles.ADMIN))
    reply = request(
        creds.url,
        f"$JS.API.STREAM.INFO.{subjects.EVENTS_STREAM}",
        b"",
        user=creds.user,
        password=creds.password,
        inbox_prefix=subjects.inbox_prefix(creds.user),
    )
    return int(json.loads(reply.data)["state"]["last_seq"])


@pytest.fixture
def unchanged_log(local_cluster: LocalCluster) -> Callable[[], None]:
    """Assert, when called, that nothing was appended since the fixture was set up."""
    before = log_last_seq(local_cluster)

    def check() -> None:
        assert log_last_seq(local_cluster) == before
        local_cluster.check_alive()

    return check


SCRIPT = "#!/bin/sh\ntrue\n"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--bogus-option"], "unrecognized option '--bogus-option'"),
        (["--time=1:2:3:4"], "--time"),
        (["--time=abc"], "--time"),
        (["--gres=gpu:-1"], "--gres"),
        (["-N", "0"], "--nodes"),
        (["--gres=gpu:99"], "never run"),
        (["-p", "nosuch"], "partition"),
        (["/no/such/script.sh"], "Unable to open file /no/such/script.sh"),
    ],
    ids=[
        "unknown-option",
        "malformed-time",
        "garbage-time",
        "negative-gres",
        "zero-nodes",
        "more-gpus-than-any-node",
        "unknown-partition",
        "missing-script",
    ],
)
def test_sbatch_rejects_bad_input(
    cli: Cli, unchanged_log: Callable[[], None], argv: list[str], needle: str
) -> None:
    stdin = None if argv[-1].endswith(".sh") else SCRIPT
    out = cli("sbatch", *argv, stdin=stdin)
    assert out.returncode != 0
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sbatch: error:"), out.stderr
    assert needle in lines[0]
    unchanged_log()


def test_script_without_shebang_is_rejected(
    cli: Cli, unchanged_log: Callable[[], None], tmp_path: Path
) -> None:
    out = cli("sbatch", stdin="echo no interpreter\n")
    assert out.returncode != 0 and "#!" in out.stderr
    unchanged_log()


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b'{"type":"submit"}', b'{"type":"submit","token":"t","spec":{"name":1}}', b"\xff" * 1000],
    ids=["empty", "truncated-json", "missing-fields", "wrong-type", "binary"],
)
def test_malformed_api_message_gets_an_error_reply(
    local_cluster: LocalCluster, unchanged_log: Callable[[], None], payload: bytes
) -> None:
    creds = read_credentials(local_cluster.user_credentials)
    reply = request(
        creds.url,
        subjects.api_subject("submit", creds.user),
        payload,
        user=creds.user,
        password=creds.password,
        inbox_prefix=subjects.inbox_prefix(creds.user),
        timeout=5,
    )
    body = json.loads(reply.data)
    assert body["type"] == "error" and body["error"].startswith("malformed submit request"), body
    unchanged_log()


def test_a_user_cannot_publish_events_or_call_as_someone_else(local_cluster: LocalCluster) -> None:
    from corral.libs.runtime.nats_request import PermissionDenied

    creds = read_credentials(local_cluster.user_credentials)
    for subject in ("corral.evt.job.1.job_cancelled", subjects.api_subject("submit", "someone-else")):
        with pytest.raises(PermissionDenied):
            request(
                creds.url,
                subject,
                b"{}",
                user=creds.user,
                password=creds.password,
                inbox_prefix=subjects.inbox_prefix(creds.user),
                timeout=5,
            )
