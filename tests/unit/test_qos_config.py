"""``[[qos]]`` tables, partition QOS, account and node limits, and association limits in the configuration."""

from __future__ import annotations

import pytest

from corral.libs.config.cluster import ConfigError, parse_config
from corral.libs.core.qos import AssocLimits, QosPolicy
from corral.services.scheduler.views import policy_of

pytestmark = pytest.mark.unit

NODES = '[[nodes]]\nnames = "gpu[1-2]"\ncpus = 8\ngpus = 8\n'

FULL = (
    NODES
    + """
[scheduler]
priority_weight_qos = 1000
default_qos = "standard"

[[qos]]
name = "standard"
max_submit_jobs_per_user = 100

[[qos]]
name = "high"
priority = 100
max_gres_per_user = 16
max_jobs_per_user = 4
grp_gres = 32
max_wall = "2-00:00:00"
preempt = ["standard", "normal"]
preempt_mode = "requeue"
grace_time = "2:00"

[[partitions]]
name = "gpu"
qos = "high"
allow_qos = ["high", "standard"]
allow_accounts = ["ml"]
max_nodes = 2

[[partitions]]
name = "debug"

[[accounts]]
name = "ml"
grp_gres = 12
grp_jobs = 10

[[accounts]]
name = "vision"
parent = "ml"
users = ["alice"]
max_jobs_per_user = 2
max_gres_per_user = 8
max_submit_jobs_per_user = 20
"""
)


def test_full_qos_config() -> None:
    config = parse_config(FULL)
    assert config.qos == (
        QosPolicy("normal"),
        QosPolicy("standard", max_submit_jobs_per_user=100),
        QosPolicy(
            "high",
            priority=100,
            max_gres_per_user=16,
            max_jobs_per_user=4,
            grp_gres=32,
            max_wall_s=2 * 86400,
            preempt=("standard", "normal"),
            preempt_mode="requeue",
            grace_time_s=120,
        ),
    )
    gpu, debug = config.partitions
    assert (gpu.qos, gpu.allow_qos, gpu.allow_accounts, gpu.max_nodes) == (
        "high",
        ("high", "standard"),
        ("ml",),
        2,
    )
    assert (debug.qos, debug.allow_qos, debug.allow_accounts, debug.max_nodes) == (None, (), (), None)
    assert config.account("ml").limits == AssocLimits("ml", grp_gres=12, grp_jobs=10)  # type: ignore[union-attr]
    assert config.account("vision").limits == AssocLimits(  # type: ignore[union-attr]
        "vision", max_jobs_per_user=2, max_gres_per_user=8, max_submit_jobs_per_user=20
    )
    pol = policy_of(config)
    assert pol.default_qos == "standard" and pol.weights.qos == 1000
    assert pol.by_name["gpu"].qos == "high" and pol.by_name["debug"].qos is None
    assert pol.qos_by_name["high"].grace_time_s == 120
    assert [a.account for a in pol.account_limits] == ["ml", "vision"]


def test_normal_always_exists_and_may_be_redefined() -> None:
    assert parse_config(NODES).qos == (QosPolicy("normal"),)
    config = parse_config(NODES + '[[qos]]\nname = "normal"\npriority = 5\nmax_jobs_per_user = 3\n')
    assert config.qos == (QosPolicy("normal", priority=5, max_jobs_per_user=3),)
    assert config.scheduler.default_qos == "normal"


BAD = {
    "unknown-key": ('[[qos]]\nname = "a"\nmax_gpus = 3\n', "qos[0]: unknown key 'max_gpus'"),
    "no-name": ("[[qos]]\npriority = 3\n", "qos[0].name"),
    "twice": ('[[qos]]\nname = "a"\n[[qos]]\nname = "a"\n', "qos[1].name: QOS 'a' is defined twice"),
    "negative-limit": ('[[qos]]\nname = "a"\nmax_gres_per_user = -1\n', "qos[0].max_gres_per_user"),
    "bad-mode": ('[[qos]]\nname = "a"\npreempt_mode = "suspend"\n', "qos[0].preempt_mode"),
    "bad-grace": ('[[qos]]\nname = "a"\ngrace_time = -5\n', "qos[0].grace_time"),
    "bad-wall": ('[[qos]]\nname = "a"\nmax_wall = "soon"\n', "qos[0].max_wall"),
    "preempt-unknown": ('[[qos]]\nname = "a"\npreempt = ["b"]\n', "qos[0].preempt: QOS 'b' is not defined"),
    "preempt-self": ('[[qos]]\nname = "a"\npreempt = ["a"]\n', "qos[0].preempt: QOS 'a' cannot preempt"),
    "preempt-unknown-second-table": (
        '[[qos]]\nname = "a"\n[[qos]]\nname = "b"\npreempt = ["a", "normal", "c"]\n',
        "qos[1].preempt: QOS 'c' is not defined",
    ),
    "default-unknown": ('[scheduler]\ndefault_qos = "gold"\n', "scheduler.default_qos: QOS 'gold'"),
    "partition-qos-unknown": ('[[partitions]]\nname = "p"\nqos = "gold"\n', "partitions[0].qos"),
    "allow-qos-unknown": ('[[partitions]]\nname = "p"\nallow_qos = ["gold"]\n', "partitions[0].allow_qos"),
    "default-not-allowed": (
        '[[qos]]\nname = "a"\n[[partitions]]\nname = "p"\nallow_qos = ["a"]\n',
        "partitions[0].allow_qos: the partition's default QOS 'normal' is not allowed",
    ),
    "allow-accounts-unknown": (
        '[[accounts]]\nname = "ml"\n[[partitions]]\nname = "p"\nallow_accounts = ["cv"]\n',
        "partitions[0].allow_accounts: account 'cv'",
    ),
    "max-nodes-zero": ('[[partitions]]\nname = "p"\nmax_nodes = 0\n', "partitions[0].max_nodes"),
    "assoc-limit-type": ('[[accounts]]\nname = "ml"\ngrp_gres = "8"\n', "accounts[0].grp_gres"),
    "weight-negative": ("[scheduler]\npriority_weight_qos = -1\n", "scheduler.priority_weight_qos"),
}


@pytest.mark.parametrize(("text", "named"), BAD.values(), ids=BAD.keys())
def test_bad_qos_config_is_named(text: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(NODES + text)
    assert named in str(caught.value)
