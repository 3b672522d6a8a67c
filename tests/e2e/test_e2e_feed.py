"""The job event feed of a cluster of real processes, read as an outside system would: the Node.js example
(``examples/feed-follow``, the npm ``nats`` package) prints its user's jobs' lifecycle and nothing of another
user's; every message captured from the cluster (API requests and replies, log entries, feed messages) is
valid against the committed JSON Schemas, checked by a real validator; and a message out of the bounds is
refused by both the schema and the gateway."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from e2e_cli import BIN, Cli, cli_as, guest_cluster, user_env

from corral.cli.local_cluster import LocalCluster
from corral.libs.infra import roles
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.streams import connect
from corral.schemas import generate, subjects

pytestmark = pytest.mark.e2e

#: A second user of the cluster.
GUEST = "mallory"
EXAMPLE = Path(__file__).parents[2] / "examples" / "feed-follow"
FAILING = "#!/bin/bash\n#SBATCH -o /dev/null\nexit 3\n"
PASSING = "#!/bin/bash\n#SBATCH -o /dev/null\ntrue\n"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A 1-node cluster of our own with a guest user."""
    with guest_cluster(tmp_path_factory.mktemp("feed"), 1, (GUEST,)) as cluster:
        yield cluster


@pytest.fixture
def cli(cluster: LocalCluster, tmp_path: Path) -> Cli:
    """The commands as the cluster's user."""
    return Cli(env=user_env(cluster.state_dir), workdir=tmp_path)


def validator(name: str) -> jsonschema.protocols.Validator:
    """A validator of the committed schema ``schemas/jsonschema/<name>`` (checked itself first)."""
    schema = json.loads((generate.SCHEMA_DIR / name).read_text())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


async def _stream(cluster: LocalCluster, stream: str) -> list[tuple[str, bytes]]:
    """(subject, data) of every message of a stream, read as the admin."""
    nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="test-admin")
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            raw = await js.get_msg(stream, seq=seq)
            out.append((raw.subject or "", raw.data or b""))
        return out
    finally:
        await nc.close()


def feed_of(cluster: LocalCluster) -> list[tuple[str, dict[str, Any]]]:
    """The feed's messages, decoded as JSON."""
    return [(s, json.loads(d)) for s, d in asyncio.run(_stream(cluster, subjects.FEED_STREAM))]


def wait_ended(cluster: LocalCluster, job: int, timeout: float = 60.0) -> dict[str, Any]:
    """The feed's ``ended`` message of ``job``, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for subject, message in feed_of(cluster):
            if subject.endswith(f".{job}.ended"):
                return message
        time.sleep(0.5)
    raise AssertionError(f"no ended message of job {job} in the feed in {timeout}s")


@pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None, reason="the example needs node and npm"
)
def test_the_node_example_prints_its_user_s_jobs_and_nothing_of_another_user_s(
    cluster: LocalCluster, cli: Cli, tmp_path: Path
) -> None:
    mine = cli.sbatch(FAILING)
    theirs = cli_as(cli, cluster, cluster.credentials_of(GUEST)).sbatch(PASSING)
    assert wait_ended(cluster, mine)["event"]["state"] == "FAILED"
    wait_ended(cluster, theirs)
    app = tmp_path / "feed-follow"
    app.mkdir()
    for name in ("package.json", "package-lock.json", "follow.js"):
        shutil.copy(EXAMPLE / name, app / name)
    npm = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"], cwd=app, capture_output=True, text=True, timeout=300
    )
    assert npm.returncode == 0, npm.stderr
    env = {
        "PATH": user_env(cluster.state_dir)["PATH"],
        "CORRAL_CREDENTIALS": str(cluster.credentials_of(cluster.user)),
    }
    run = subprocess.run(
        ["node", "follow.js", "--idle-exit", "3"],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    printed = [json.loads(line) for line in run.stdout.splitlines()]
    feed = validator("feed-v1.json")
    for message in printed:
        feed.validate({k: v for k, v in message.items() if k != "subject"})
    about_mine = [
        (m["event"]["type"], m["event"].get("state")) for m in printed if m["event"]["job_id"] == mine
    ]
    assert about_mine == [("submitted", None), ("started", None), ("ended", "FAILED")], printed
    assert next(m for m in printed if m["event"]["type"] == "ended")["event"]["exit_code"] == 3
    assert all(m["event"]["user"] == cluster.user for m in printed), printed
    assert theirs not in {m["event"]["job_id"] for m in printed}
    assert GUEST not in run.stdout


def test_corral_feed_prints_the_guest_s_jobs_only(cluster: LocalCluster, cli: Cli) -> None:
    guest = cli_as(cli, cluster, cluster.credentials_of(GUEST))
    job = guest.sbatch(PASSING)
    wait_ended(cluster, job)
    out = guest("corral", "feed", "--idle-exit", "2")
    assert out.returncode == 0, out.stderr
    printed = [json.loads(line) for line in out.stdout.splitlines()]
    assert [m["event"]["type"] for m in printed if m["event"]["job_id"] == job] == [
        "submitted",
        "started",
        "ended",
    ]
    assert {m["event"]["user"] for m in printed} == {GUEST}
    assert all(m["subject"].split(".")[5] == GUEST for m in printed)


async def _capture_submit(cluster: LocalCluster, cli: Cli) -> tuple[bytes, bytes]:
    """A real sbatch's API request and its reply, seen by the admin (who may read any subject)."""
    nc = await connect(read_credentials(cluster.role_credentials(roles.ADMIN)), name="test-capture")
    try:
        requests = await nc.subscribe(subjects.api_subject("submit", cluster.user))
        replies = await nc.subscribe(f"{subjects.inbox_prefix(cluster.user)}.>")
        await nc.flush()
        sbatch = await asyncio.create_subprocess_exec(
            str(BIN / "sbatch"),
            "--parsable",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=cli.workdir,
            env=cli.env,
        )
        await sbatch.communicate(PASSING.encode())
        assert sbatch.returncode == 0
        request = await requests.next_msg(timeout=10)
        while True:
            reply = await replies.next_msg(timeout=10)
            if reply.subject == request.reply:
                return request.data, reply.data
    finally:
        await nc.close()


def test_messages_captured_from_the_cluster_are_valid_against_the_json_schemas(
    cluster: LocalCluster, cli: Cli
) -> None:
    request, reply = asyncio.run(_capture_submit(cluster, cli))
    validator("api-request.json").validate(json.loads(request))
    validator("api-reply.json").validate(json.loads(reply))
    job = json.loads(reply)["job_id"]
    wait_ended(cluster, job)
    envelope = validator("envelope.json")
    entries = asyncio.run(_stream(cluster, subjects.EVENTS_STREAM))
    for _, data in entries:
        envelope.validate(json.loads(data))
    assert {json.loads(d)["body"]["type"] for _, d in entries} >= {
        "job_submitted",
        "job_allocated",
        "run_exited",
    }
    feed = validator("feed-v1.json")
    messages = feed_of(cluster)
    for _, message in messages:
        feed.validate(message)
    assert {m["event"]["type"] for _, m in messages} >= {"submitted", "started", "ended"}


async def _submit_as_user(cluster: LocalCluster, data: bytes) -> dict[str, Any]:
    nc = await connect(read_credentials(cluster.credentials_of(cluster.user)), name="test-user")
    try:
        msg = await nc.request(subjects.api_subject("submit", cluster.user), data, timeout=10)
        reply: dict[str, Any] = json.loads(msg.data)
        return reply
    finally:
        await nc.close()


#: A submission within every bound, which each case below takes one field of out of its bound.
WITHIN = {
    "type": "submit",
    "token": "bounds",
    "spec": {"name": "bounds", "script": PASSING, "workdir": "/tmp"},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.nodes", 0),
        ("spec.name", "x" * 300),
        ("spec.argv", ["a"] * 2000),
        ("spec.nice", 2**31),
        ("token", "t" * 200),
    ],
    ids=["nodes 0", "name too long", "too many arguments", "nice too large", "token too long"],
)
def test_an_out_of_bounds_submission_is_refused_by_the_schema_and_by_the_gateway(
    cluster: LocalCluster, path: str, value: Any
) -> None:
    schema = validator("api-request.json")
    schema.validate(WITHIN)
    request = json.loads(json.dumps(WITHIN))
    *parents, field = path.split(".")
    target = request
    for name in parents:
        target = target[name]
    target[field] = value
    assert not schema.is_valid(request)
    submit = type(schema)({"$ref": "#/$defs/SubmitRequest", "$defs": schema.schema["$defs"]})
    refused = jsonschema.exceptions.best_match(submit.iter_errors(request))
    assert refused is not None and list(refused.absolute_path) == path.split("."), refused
    reply = asyncio.run(_submit_as_user(cluster, json.dumps(request).encode()))
    assert reply["type"] == "error" and reply["field"] == path, reply
