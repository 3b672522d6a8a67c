"""Submit-time QOS, partition and association checks of the gateway (``services/gateway/policy.py``)."""

from __future__ import annotations

import msgspec
import pytest
from builders import job

from corral.libs.config.cluster import parse_config
from corral.libs.runtime.errors import Forbidden, InvalidInput
from corral.schemas.events import JobSpec
from corral.services.gateway.policy import (
    check_account,
    check_policy,
    check_submit_count,
    resolve_qos,
    submit_limits,
)

pytestmark = pytest.mark.unit

CONFIG = parse_config(
    """
[[nodes]]
names = "gpu[1-4]"
cpus = 32
gpus = 8

[[qos]]
name = "high"
priority = 10
max_gres_per_user = 16
max_wall = "4:00:00"
max_submit_jobs_per_user = 3

[[qos]]
name = "team"
grp_gres = 8

[[qos]]
name = "frozen"
max_jobs_per_user = 0

[[partitions]]
name = "gpu"
default = true
allow_accounts = ["vision", "nlp", "ml"]
max_nodes = 2

[[partitions]]
name = "prio"
qos = "high"
allow_qos = ["high"]

[[partitions]]
name = "open"

[[accounts]]
name = "ml"
grp_gres = 24

[[accounts]]
name = "vision"
parent = "ml"
users = ["alice"]
max_gres_per_user = 12
max_submit_jobs_per_user = 2

[[accounts]]
name = "nlp"
parent = "ml"
users = ["bob"]
"""
)


def spec(**fields: object) -> JobSpec:
    """A resolved one-node, 1-GPU job of alice in account vision, partition gpu."""
    base = job(gpus=1, nodes=1, partition="gpu", account="vision")
    return msgspec.structs.replace(base, **fields)


ACCEPTED = {
    "plain": spec(),
    "qos-allowed": spec(qos="high", gpus_per_node=6, nodes=2),
    "partition-qos": spec(partition="prio"),
    "maxwall-equal": spec(qos="high", time_limit_s=4 * 3600),
    "max-nodes": spec(nodes=2),
    "cpu-job-over-gpu-limits": spec(qos="team", gpus_per_node=0, nodes=2),
    "open-partition-any-account": spec(partition="open", account="carol"),
}


@pytest.mark.parametrize("spec_", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_accepted(spec_: JobSpec) -> None:
    check_policy(spec_, "alice", CONFIG, admin=False)


POLICY = "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)"
REFUSED = {
    "unknown-qos": (spec(qos="gold"), "qos", "Invalid qos specification: QOS 'gold' does not exist"),
    "qos-not-allowed": (
        spec(partition="prio", qos="team"),
        "qos",
        "Invalid qos specification: partition prio allows QOS high, not 'team'",
    ),
    "account-not-allowed": (
        spec(account="carol"),
        "account",
        "Invalid account or account/partition combination specified: partition gpu allows accounts",
    ),
    "max-nodes": (spec(nodes=3), "nodes", "Node count specification invalid: 3 nodes requested"),
    "maxwall": (spec(qos="high", time_limit_s=4 * 3600 + 1), "time_limit_s", f"{POLICY}: time limit 14401s"),
    "qos-max-gres-per-user": (
        spec(qos="high", partition="open", gpus_per_node=8, nodes=3, account="nlp"),
        "gpus_per_node",
        f"{POLICY}: 24 GPUs requested, QOS high MaxTRESPerUser=gres/gpu=16",
    ),
    "qos-grp-gres": (
        spec(qos="team", gpus_per_node=8, nodes=2, account="nlp"),
        "gpus_per_node",
        f"{POLICY}: 16 GPUs requested, QOS team GrpTRES=gres/gpu=8",
    ),
    "assoc-per-user-gres": (
        spec(gpus_per_node=8, nodes=2),
        "gpus_per_node",
        f"{POLICY}: 16 GPUs requested, account vision per-user GrpTRES=gres/gpu=12",
    ),
    "assoc-parent-grp-gres": (
        spec(partition="open", gpus_per_node=8, nodes=4, account="nlp"),
        "gpus_per_node",
        f"{POLICY}: 32 GPUs requested, account ml GrpTRES=gres/gpu=24",
    ),
    "zero-jobs": (spec(qos="frozen"), "qos", f"{POLICY}: QOS frozen MaxJobsPerUser=0"),
    "nice-out-of-bounds": (spec(nice=2147483646), "nice", "Invalid nice value 2147483646"),
}


@pytest.mark.parametrize(("spec_", "field", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_refused_naming_the_field(spec_: JobSpec, field: str, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        check_policy(spec_, "alice", CONFIG, admin=False)
    assert caught.value.field == field
    assert str(caught.value).startswith(message), str(caught.value)


ACCOUNT = "Invalid account or account/partition combination specified"
ACCOUNTS = {
    "member": ("alice", "vision", None),
    "not-listed-is-own": ("zed", "zed", None),
    "no-such-account": ("alice", "nope", f"{ACCOUNT}: account 'nope' does not exist; use vision"),
    "not-a-member": ("alice", "nlp", f"{ACCOUNT}: alice may not use account 'nlp'; use vision"),
    "listed-user-is-not-own": ("bob", "bob", f"{ACCOUNT}: account 'bob' does not exist; use nlp"),
}


@pytest.mark.parametrize(("user", "account", "message"), ACCOUNTS.values(), ids=ACCOUNTS.keys())
def test_an_account_the_user_may_not_charge_is_refused(user: str, account: str, message: str | None) -> None:
    if message is None:
        check_account(account, user, CONFIG)
        return
    with pytest.raises(InvalidInput) as caught:
        check_account(account, user, CONFIG)
    assert caught.value.field == "account"
    assert str(caught.value) == f"{message} (or give no account)"


def test_negative_nice_is_for_admins() -> None:
    with pytest.raises(Forbidden, match="Access/permission denied"):
        check_policy(spec(nice=-10), "alice", CONFIG, admin=False)
    check_policy(spec(nice=-10), "root", CONFIG, admin=True)
    check_policy(spec(nice=10), "alice", CONFIG, admin=False)


RESOLVE = {
    "own": (spec(qos="team"), "team"),
    "partition": (spec(partition="prio"), "high"),
    "default": (spec(), "normal"),
    "default-partition": (spec(partition=None), "normal"),
}


@pytest.mark.parametrize(("spec_", "name"), RESOLVE.values(), ids=RESOLVE.keys())
def test_resolve_qos(spec_: JobSpec, name: str) -> None:
    assert resolve_qos(spec_, CONFIG) == name


SUBMIT = {
    "qos-under": (spec(qos="high", account="nlp"), [("high", "nlp", 2)], 1, None),
    "qos-at-limit": (spec(qos="high", account="nlp"), [("high", "nlp", 3)], 1, "QOS high"),
    "qos-array-over": (spec(qos="high", account="nlp"), [("high", "nlp", 1)], 3, "QOS high"),
    "qos-other-jobs-ignored": (spec(qos="high", account="nlp"), [("normal", "nlp", 5)], 1, None),
    "qos-summed-over-accounts": (
        spec(qos="high", account="nlp"),
        [("high", "nlp", 1), ("high", "vision", 2)],
        1,
        "QOS high",
    ),
    "assoc-at-limit": (spec(), [("normal", "vision", 1), ("team", "vision", 1)], 1, "vision"),
    "assoc-other-accounts-ignored": (spec(), [("normal", "nlp", 4)], 1, None),
}


@pytest.mark.parametrize(("spec_", "live", "adding", "named"), SUBMIT.values(), ids=SUBMIT.keys())
def test_max_submit_jobs(
    spec_: JobSpec, live: list[tuple[str, str, int]], adding: int, named: str | None
) -> None:
    limits = submit_limits(spec_, "alice", CONFIG)
    assert limits
    if named is None:
        check_submit_count(limits, live, adding)
        return
    with pytest.raises(InvalidInput) as caught:
        check_submit_count(limits, live, adding)
    assert str(caught.value).startswith(POLICY) and named in str(caught.value)


def test_no_submit_limit_no_count() -> None:
    assert submit_limits(spec(account="nlp"), "bob", CONFIG) == []


def test_enforce_part_limits_no_accepts_what_its_partition_would_refuse() -> None:
    # Slurm's EnforcePartLimits=NO: sbatch -N 99 on a small partition is accepted and pends (PartitionConfig,
    # PartitionNodeLimit, PartitionTimeLimit: plan.py); Corral's default, ALL, refuses at submit.
    import dataclasses

    from corral.services.gateway.validate import validate_spec

    lenient = dataclasses.replace(CONFIG, enforce_part_limits="NO")
    check_policy(spec(nodes=3), "alice", lenient, admin=False)  # over MaxNodes=2
    validate_spec(spec(partition="open", nodes=99), lenient)  # 4 nodes in the partition
    with pytest.raises(InvalidInput, match="job can never run: 99 nodes requested") as caught:
        validate_spec(spec(partition="open", nodes=99), CONFIG)
    assert caught.value.field == "nodes"
    # What no node of the partition could ever hold stays refused either way.
    with pytest.raises(InvalidInput, match="9 GPUs per node requested"):
        validate_spec(spec(partition="open", gpus_per_node=9), lenient)


def test_enforce_part_limits_is_slurms_setting() -> None:
    assert CONFIG.enforce_part_limits == "ALL"
    text = '[cluster]\nenforce_part_limits = "NO"\n[[nodes]]\nnames = "n1"\ncpus = 2\n'
    text += '[[partitions]]\nname = "p"\n'
    assert parse_config(text).enforce_part_limits == "NO"
    with pytest.raises(ValueError, match=r"cluster\.enforce_part_limits: 'some' is not one of ALL, ANY, NO"):
        parse_config(text.replace('"NO"', '"some"'))
