"""The gateway's submit on the in-memory ports: what it appends, what it refuses without a trace, retries.

A refused submission appends nothing and reserves no job id; an accepted one appends one ``JobSubmitted``
with the partition, account and QOS it really gets; a retry with the same token is the same job.
"""

from __future__ import annotations

import dataclasses

import pytest

from corral.libs.runtime.errors import Forbidden, InvalidInput, TransientError
from corral.libs.slurm.array import parse_array
from corral.schemas import api
from corral.schemas import events as ev
from corral.services.gateway.app import DEPENDENCY_PROBLEM
from tests.unit.builders import job
from tests.unit.rigs import Rig

# A fake clock nobody advances would hang a test that waits on it: fail it fast instead.
pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


async def test_a_submission_appends_the_job_as_it_will_run() -> None:
    rig = Rig()
    job_id = await rig.submit()
    [submitted] = rig.appended(job_id)
    assert isinstance(submitted, ev.JobSubmitted)
    assert (submitted.job_id, submitted.user) == (job_id, "alice")
    assert (submitted.spec.partition, submitted.spec.account, submitted.spec.qos) == (
        "gpu",
        "alice",
        "normal",
    )


async def test_a_retry_with_the_same_token_is_the_same_job() -> None:
    rig = Rig()
    first = await rig.submit(token="tok")
    again = await rig.submit(token="tok")
    other = await rig.submit(token="tok2")
    assert again == first and other != first
    assert len(rig.log.bodies("corral.evt.job.*.job_submitted")) == 2


async def test_an_array_reserves_its_block_of_ids() -> None:
    rig = Rig()
    array = await rig.gateway.submit(
        "alice", api.SubmitRequest(token="a", spec=job(nodes=1, gpus=1, array=parse_array("0-4")))
    )
    assert isinstance(array, api.SubmitReply)
    assert await rig.submit(token="b") == array.job_id + 5


REFUSED: list[tuple[str, str, dict[str, object], str, str]] = [
    ("empty-token", "", {}, "token", "token must be 1-128 characters"),
    ("long-token", "x" * 129, {}, "token", "token must be 1-128 characters"),
    (
        "no-such-partition",
        "t",
        {"partition": "nope"},
        "partition",
        "Invalid partition name specified: partition 'nope' does not exist; choose one of gpu, cpu",
    ),
    ("too-many-gpus", "t", {"gpus": 9}, "gpus_per_node", "job can never run: 9 GPUs per node requested"),
    (
        "no-such-account",
        "t",
        {"account": "nope"},
        "account",
        "Invalid account or account/partition combination specified: account 'nope' does not exist; "
        "use alice (or give no account)",
    ),
    (
        "no-such-qos",
        "t",
        {"qos": "nope"},
        "qos",
        "Invalid qos specification: QOS 'nope' does not exist; choose one of normal",
    ),
    (
        "nul-in-script",
        "t",
        {"script": "#!/bin/sh\n\0"},
        "script",
        "script contains a NUL byte (character 10)",
    ),
]


@pytest.mark.parametrize(
    ("token", "spec", "field", "message"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
async def test_a_refused_submission_leaves_no_trace(
    token: str, spec: dict[str, object], field: str, message: str
) -> None:
    rig = Rig()
    fields = {"nodes": 1, "gpus": 1} | spec
    with pytest.raises(InvalidInput) as refused:
        await rig.gateway.submit("alice", api.SubmitRequest(token=token, spec=job(**fields)))
    assert refused.value.field == field
    assert str(refused.value).startswith(message), str(refused.value)
    assert rig.log.bodies() == [] and await rig.log.last_job_id() == 0


async def test_a_job_of_root_is_refused_naming_the_setting_unless_the_cluster_allows_it() -> None:
    rig = Rig()
    with pytest.raises(Forbidden) as refused:
        await rig.submit(user="root")
    assert "root may not submit jobs here" in str(refused.value)
    assert "set [cluster] allow_root_jobs = true" in str(refused.value)
    assert rig.log.bodies() == []
    rig.gateway.submissions.config = dataclasses.replace(rig.gateway.config, allow_root_jobs=True)
    [submitted] = rig.appended(await rig.submit(user="root"))
    assert isinstance(submitted, ev.JobSubmitted) and submitted.user == "root"


async def test_a_user_s_own_name_is_their_account_when_none_is_configured() -> None:
    rig = Rig()
    [submitted] = rig.appended(await rig.submit(account="alice"))
    assert isinstance(submitted, ev.JobSubmitted) and submitted.spec.account == "alice"


async def test_a_dependency_on_a_job_never_submitted_is_refused() -> None:
    rig = Rig()
    earlier = await rig.submit(token="first")
    on_it = ev.Dependencies(items=[ev.Dependency(type="afterok", job_id=ev.JobId(earlier))])
    later = await rig.submit(token="second", dependencies=on_it)
    assert later == earlier + 1
    missing = ev.Dependencies(items=[ev.Dependency(type="afterok", job_id=ev.JobId(earlier + 50))])
    with pytest.raises(InvalidInput, match=DEPENDENCY_PROBLEM):
        await rig.submit(token="third", dependencies=missing)
    assert len(rig.log.bodies()) == 2


async def test_test_only_asks_the_scheduler_and_appends_nothing() -> None:
    rig = Rig()  # no scheduler serves will_run
    request = api.SubmitRequest(token="t", spec=job(nodes=1, gpus=1), test_only=True)
    with pytest.raises(TransientError, match="did not answer in time"):
        await rig.gateway.submit("alice", request)
    assert rig.log.bodies() == [] and await rig.log.last_job_id() == 0
