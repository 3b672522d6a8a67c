"""Bad input: a clear one-line error naming the problem, a non-zero exit, nothing in the log, no crash."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from e2e_cli import Cli

from corral.cli.local_cluster import LocalCluster
from corral.libs.infra import roles
from corral.libs.runtime.credentials import read_credentials
from corral.libs.runtime.nats_request import request
from corral.schemas import subjects
from corral.schemas.api import SubmitRequest
from corral.schemas.codec import encode
from corral.schemas.events import JobSpec

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


#: Slurm 22.05's first line of each refusal (sbatch's getopt, slurm_opt.c, the submit path) and its exit
#: status; Corral's hint (the field and the fix) follows on a line of its own (docs/slurm-compatibility.md).
FAILED = "sbatch: error: Batch job submission failed: "


@pytest.mark.parametrize(
    ("argv", "first", "hint", "status"),
    [
        (["--bogus-option"], "sbatch: unrecognized option '--bogus-option'", None, 255),
        (["--time=1:2:3:4"], "sbatch: error: Invalid --time specification", 'invalid --time "1:2:3:4"', 255),
        (["--time=abc"], "sbatch: error: Invalid --time specification", 'invalid --time "abc"', 255),
        (
            ["--gres=gpu:-1"],
            FAILED + "Invalid generic resource (gres) specification",
            'invalid --gres "gpu:-1"',
            1,
        ),
        (["-N", "0"], 'sbatch: error: invalid --nodes "0"', None, 1),
        (["--gres=gpu:99"], FAILED, None, 1),
        (
            ["-p", "nosuch"],
            FAILED + "Invalid partition name specified",
            "partition 'nosuch' does not exist",
            1,
        ),
        (
            ["-A", "nope"],
            FAILED + "Invalid account or account/partition combination specified",
            "account 'nope' does not exist",
            1,
        ),
        (["-q", "nope"], FAILED + "Invalid qos specification", "QOS 'nope' does not exist", 1),
        (["-o", "afile/%j.out"], "sbatch: error: --output=afile/%j.out: ", None, 1),
        (["/no/such/script.sh"], "sbatch: error: Unable to open file /no/such/script.sh", None, 1),
    ],
    ids=[
        "unknown-option",
        "malformed-time",
        "garbage-time",
        "negative-gres",
        "zero-nodes",
        "more-gpus-than-any-node",
        "unknown-partition",
        "unknown-account",
        "unknown-qos",
        "output-under-a-file",
        "missing-script",
    ],
)
def test_sbatch_rejects_bad_input(
    cli: Cli, unchanged_log: Callable[[], None], argv: list[str], first: str, hint: str | None, status: int
) -> None:
    (cli.workdir / "afile").write_text("")
    stdin = None if argv[-1].endswith(".sh") else SCRIPT
    out = cli("sbatch", *argv, stdin=stdin)
    assert (out.returncode, out.stdout) == (status, ""), out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith(first), out.stderr
    if first.startswith("sbatch: unrecognized"):
        assert lines == [first, 'Try "sbatch --help" for more information']
    elif hint is None:  # Slurm's line is Corral's own, or Slurm has no such check: one line
        assert len(lines) == 1, out.stderr
    else:
        assert len(lines) == 2 and lines[1].startswith("sbatch: error: ") and hint in lines[1], out.stderr
    unchanged_log()


def test_script_without_shebang_is_rejected(
    cli: Cli, unchanged_log: Callable[[], None], tmp_path: Path
) -> None:
    out = cli("sbatch", stdin="echo no interpreter\n")
    assert out.returncode != 0 and "#!" in out.stderr
    unchanged_log()


def test_a_script_with_a_nul_byte_is_refused(cli: Cli, unchanged_log: Callable[[], None]) -> None:
    out = cli("sbatch", stdin="#!/bin/sh\necho a\0b\n")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == (
        "sbatch: error: batch script contains a NUL byte (byte 16): a batch script must be text; "
        "remove the \\0 characters\n"
    )
    unchanged_log()


def test_the_gateway_refuses_a_nul_byte_from_any_client(
    local_cluster: LocalCluster, unchanged_log: Callable[[], None]
) -> None:
    # An API client need not use sbatch: the gateway is where the rule is enforced.
    spec = JobSpec(name="x", script="#!/bin/sh\n\0", workdir="/tmp")
    body = submit_reply(local_cluster, encode(SubmitRequest(token="nul", spec=spec)))
    assert body["type"] == "error" and body["field"] == "script", body
    assert body["error"].startswith("script contains a NUL byte (character 10)"), body
    unchanged_log()


def test_an_output_file_that_cannot_be_opened_at_launch_is_named(cli: Cli) -> None:
    # Accepted at submit (the directory is there), gone when the job starts: the job fails saying why.
    logs = cli.workdir / "logs-launch"
    logs.mkdir()
    job = cli.sbatch(SCRIPT, "-H", "-o", f"{logs.name}/%j.out")
    logs.rmdir()
    logs.write_text("")  # a file where the directory was
    assert cli("scontrol", "release", str(job)).returncode == 0
    cli.wait_state(job, ("FAILED",))
    out = cli("corral", "audit", "--json", str(job))
    [failed] = [e for e in json.loads(out.stdout)["entries"] if e["event"] == "job_failed"]
    assert failed["what"]["reason"] == "LaunchFailed", failed
    assert failed["what"]["message"] == f"cannot open output file {logs}/{job}.out: {logs} is not a directory"
    # scontrol shows it as the job's Reason (its EndReason and the detail), not Reason=None; white space
    # as "_", as Slurm prints a reason's description.
    shown = cli("scontrol", "show", "job", str(job)).stdout
    assert f"Reason=LaunchFailed,_cannot_open_output_file_{logs}/{job}.out" in shown, shown


def submit_reply(cluster: LocalCluster, payload: bytes) -> dict[str, Any]:
    """The gateway's reply to a submit request of the cluster's user, decoded."""
    creds = read_credentials(cluster.user_credentials)
    reply = request(
        creds.url,
        subjects.api_subject("submit", creds.user),
        payload,
        user=creds.user,
        password=creds.password,
        inbox_prefix=subjects.inbox_prefix(creds.user),
        timeout=5,
    )
    return cast(dict[str, Any], json.loads(reply.data))


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b'{"type":"submit"}', b'{"type":"submit","token":"t","spec":{"name":1}}', b"\xff" * 1000],
    ids=["empty", "truncated-json", "missing-fields", "wrong-type", "binary"],
)
def test_malformed_api_message_gets_an_error_reply(
    local_cluster: LocalCluster, unchanged_log: Callable[[], None], payload: bytes
) -> None:
    body = submit_reply(local_cluster, payload)
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
