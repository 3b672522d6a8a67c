"""The batch job's environment and output paths: what SLURM_CONTRACT.md promises scripts."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from corral.libs.trace.spans import span_id_for
from corral.schemas.api import LaunchOrder
from corral.schemas.events import JobSpec, NodeAllocation
from corral.services.agent.jobenv import (
    NO_ARRAY_INDEX,
    compress_counts,
    expand_pattern,
    job_environment,
    output_paths,
    tasks_per_node,
)

pytestmark = pytest.mark.unit

WORKDIR = "/home/alice/run"
UID = 1000
GID = 1001


def launch(
    gpus: dict[str, list[int]] | None = None,
    *,
    job_id: int = 4242,
    attempt: int = 0,
    cpus: int = 8,
    mem_mb: int = 0,
    user: str = "alice",
    **spec: Any,
) -> LaunchOrder:
    """A launch order for a job on ``gpus`` (node -> GPU indices, batch node first; default gpu01+gpu02)."""
    if gpus is None:
        gpus = {"gpu01": [1, 3], "gpu02": [0, 2]}
    spec.setdefault("nodes", len(gpus))
    spec.setdefault("ntasks", len(gpus))
    allocations = [NodeAllocation(node=n, gpus=g, cpus=cpus, mem_mb=mem_mb) for n, g in gpus.items()]
    return LaunchOrder(
        job_id=job_id,
        attempt=attempt,
        node=allocations[0].node,
        user=user,
        account="research",
        partition="gpu",
        spec=JobSpec(
            name=spec.pop("name", "train"),
            script="#!/bin/bash\nsrun python train.py\n",
            workdir=spec.pop("workdir", WORKDIR),
            submit_host="login1",
            **spec,
        ),
        allocations=allocations,
        time_limit_s=3600,
        cluster="test",
    )


# --- tasks per node ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ntasks", "nodes", "per_node", "expected"),
    [
        (1, 1, None, [1]),
        (4, 2, None, [2, 2]),
        (7, 4, None, [2, 2, 2, 1]),
        (5, 3, None, [2, 2, 1]),
        (2, 4, None, [1, 1, 0, 0]),
        (8, 2, 4, [4, 4]),
        (1, 3, 2, [2, 2, 2]),
    ],
    ids=[
        "one-task",
        "even-block",
        "uneven-block-extra-first",
        "uneven-two-extra",
        "fewer-tasks-than-nodes",
        "per-node",
        "per-node-overrides-ntasks",
    ],
)
def test_tasks_per_node(ntasks: int, nodes: int, per_node: int | None, expected: list[int]) -> None:
    assert tasks_per_node(ntasks, nodes, per_node) == expected


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ([1], "1"),
        ([2, 2, 2, 1], "2(x3),1"),
        ([4, 4], "4(x2)"),
        ([1, 2, 3], "1,2,3"),
        ([2, 1, 1, 2], "2,1(x2),2"),
        ([], ""),
    ],
    ids=["single", "run-then-single", "one-run", "no-runs", "run-in-the-middle", "empty"],
)
def test_compress_counts(counts: list[int], expected: str) -> None:
    assert compress_counts(counts) == expected


# --- the environment of a 2-node GPU job ------------------------------------------------------

TWO_NODE = [
    ("SLURM_JOB_ID", "4242"),
    ("SLURM_JOBID", "4242"),
    ("SLURM_JOB_NAME", "train"),
    ("SLURM_JOB_USER", "alice"),
    ("SLURM_JOB_UID", str(UID)),
    ("SLURM_JOB_GID", str(GID)),
    ("SLURM_JOB_NODELIST", "gpu[01-02]"),
    ("SLURM_NODELIST", "gpu[01-02]"),
    ("SLURM_JOB_NUM_NODES", "2"),
    ("SLURM_NNODES", "2"),
    ("SLURM_NTASKS", "4"),
    ("SLURM_NPROCS", "4"),
    ("SLURM_TASKS_PER_NODE", "2(x2)"),
    ("SLURM_NTASKS_PER_NODE", "2"),
    ("SLURM_JOB_CPUS_PER_NODE", "8(x2)"),
    ("SLURM_CPUS_ON_NODE", "8"),
    ("SLURM_PROCID", "0"),
    ("SLURM_LOCALID", "0"),
    ("SLURM_NODEID", "0"),
    ("SLURMD_NODENAME", "gpu01"),
    ("SLURM_RESTART_COUNT", "2"),
    ("SLURM_SUBMIT_DIR", WORKDIR),
    ("SLURM_SUBMIT_HOST", "login1"),
    ("SLURM_JOB_PARTITION", "gpu"),
    ("SLURM_JOB_ACCOUNT", "research"),
    ("SLURM_JOB_QOS", "normal"),
    ("SLURM_CLUSTER_NAME", "test"),
    ("SLURM_GPUS_ON_NODE", "2"),
    ("SLURM_JOB_GPUS", "1,3"),
    ("CUDA_VISIBLE_DEVICES", "1,3"),
    ("GPU_DEVICE_ORDINAL", "1,3"),
    ("ROCR_VISIBLE_DEVICES", "1,3"),
    ("ZE_AFFINITY_MASK", "1,3"),
    ("ENVIRONMENT", "BATCH"),
    ("HOSTNAME", "gpu01"),
    ("SLURM_GTIDS", "0"),
    ("SLURM_TOPOLOGY_ADDR", "gpu01"),
    ("SLURM_TOPOLOGY_ADDR_PATTERN", "node"),
    ("TMPDIR", "/tmp"),
]


@pytest.mark.parametrize(("name", "value"), TWO_NODE, ids=[name for name, _ in TWO_NODE])
def test_two_node_gpu_job_environment(name: str, value: str) -> None:
    order = launch({"gpu01": [1, 3], "gpu02": [0, 2]}, attempt=2, ntasks=4, ntasks_per_node=2)
    assert job_environment(order, {"PATH": "/usr/bin"}, UID, GID)[name] == value


def test_a_traced_job_passes_its_attempt_span_on_as_traceparent() -> None:
    trace = "0af7651916cd43dd8448eb211c80319c"
    order = msgspec.structs.replace(launch(attempt=1), traceparent=f"00-{trace}-b7ad6b7169203331-01")
    env = job_environment(order, {"TRACEPARENT": "00-submitters-own-01"}, UID, GID)
    assert env["TRACEPARENT"] == f"00-{trace}-{span_id_for(trace, 4242, 1, '', 'attempt')}-01"
    assert "TRACEPARENT" not in job_environment(launch(), {}, UID, GID)


@pytest.mark.parametrize("attempt", [0, 1, 7], ids=["first-run", "first-requeue", "seventh-requeue"])
def test_restart_count_is_always_the_attempt(attempt: int) -> None:
    assert job_environment(launch(attempt=attempt), {}, UID, GID)["SLURM_RESTART_COUNT"] == str(attempt)


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        (["gpu02", "gpu01"], "gpu[01-02]"),
        (["gpu010", "gpu001", "gpu002"], "gpu[001-002,010]"),
        (["node7"], "node7"),
        (["b1", "a2", "a1"], "a[1-2],b1"),
    ],
    ids=["unsorted-allocation", "padded-with-gap", "one-node", "two-prefixes"],
)
def test_nodelist_is_canonical(nodes: list[str], expected: str) -> None:
    env = job_environment(launch({n: [0] for n in nodes}), {}, UID, GID)
    assert (env["SLURM_JOB_NODELIST"], env["SLURM_NODELIST"]) == (expected, expected)


@pytest.mark.parametrize(
    ("nodes", "spec", "expected"),
    [
        (4, {"ntasks": 7}, ("7", "2(x3),1", None)),
        (2, {"ntasks": 8, "ntasks_per_node": 4}, ("8", "4(x2)", "4")),
        (1, {"ntasks": 1}, ("1", "1", None)),
        (3, {"ntasks": 3}, ("3", "1(x3)", None)),
    ],
    ids=["block-uneven", "per-node", "single-task", "one-per-node"],
)
def test_task_counts(nodes: int, spec: dict[str, int], expected: tuple[str, str, str | None]) -> None:
    env = job_environment(launch({f"gpu{i:02d}": [0] for i in range(1, nodes + 1)}, **spec), {}, UID, GID)
    # SLURM_NTASKS_PER_NODE only with --ntasks-per-node, as Slurm's sbatch sets it
    assert (env["SLURM_NTASKS"], env["SLURM_TASKS_PER_NODE"], env.get("SLURM_NTASKS_PER_NODE")) == expected


@pytest.mark.parametrize(
    ("spec", "name", "value"),
    [
        ({"cpus_per_task": 1}, "SLURM_CPUS_PER_TASK", None),
        ({"cpus_per_task": 4}, "SLURM_CPUS_PER_TASK", "4"),
        ({}, "SLURM_MEM_PER_NODE", None),
        ({"mem_per_node_mb": 1024}, "SLURM_MEM_PER_NODE", "2048"),
        ({}, "SLURM_GPUS_PER_TASK", None),
        ({"gpus_per_task": 2}, "SLURM_GPUS_PER_TASK", "2"),
        ({"cpus_per_gpu": 6}, "SLURM_CPUS_PER_GPU", "6"),
    ],
    ids=[
        "cpus-per-task-default-absent",
        "cpus-per-task-given",
        "mem-not-asked",
        "mem-is-the-allocation",
        "gpus-per-task-absent",
        "gpus-per-task-given",
        "cpus-per-gpu-given",
    ],
)
def test_optional_variables(spec: dict[str, int], name: str, value: str | None) -> None:
    assert job_environment(launch(mem_mb=2048, **spec), {}, UID, GID).get(name) == value


# --- GPUs and the inherited environment -------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "exported"),
    [
        ({}, {}),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, {}),
        ({}, {"CUDA_VISIBLE_DEVICES": "2", "ZE_AFFINITY_MASK": "2", "SLURM_GPUS_ON_NODE": "1"}),
    ],
    ids=["clean", "agent-had-cuda-devices", "submitter-exported-cuda-devices"],
)
def test_cpu_only_job_has_no_gpu_variables(base: dict[str, str], exported: dict[str, str]) -> None:
    env = job_environment(launch({"cpu01": []}, environment=exported), base, UID, GID)
    # Slurm's gres/gpu plugin unsets them all when the job has no GPU here (SLURM_GPUS_ON_NODE too)
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE", "ZE_AFFINITY_MASK"):
        assert name not in env


def test_gpu_job_overrides_the_agents_cuda_devices() -> None:
    env = job_environment(launch({"gpu01": [5]}), {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, UID, GID)
    assert env["CUDA_VISIBLE_DEVICES"] == env["SLURM_JOB_GPUS"] == "5"


PARENT_JOB = {
    "PATH": "/usr/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "SLURM_JOB_ID": "99",
    "SLURM_JOBID": "99",
    "SLURM_ARRAY_JOB_ID": "98",
    "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_CPUS_PER_TASK": "16",
    "SLURM_MEM_PER_NODE": "4096",
    "SBATCH_PARTITION": "debug",
}
EXPORTED = {"PATH": "/opt/conda/bin:/usr/bin", "HOME": "/home/alice", "MY_FLAG": "on"}

INHERITANCE = [
    ("SLURM_JOB_ID", "4242"),
    ("SLURM_JOBID", "4242"),
    ("SLURM_ARRAY_JOB_ID", None),
    ("SLURM_ARRAY_TASK_ID", None),
    ("SLURM_CPUS_PER_TASK", None),
    ("SLURM_MEM_PER_NODE", None),
    ("SBATCH_PARTITION", None),
    ("PATH", "/opt/conda/bin:/usr/bin"),
    ("HOME", "/home/alice"),
    ("MY_FLAG", "on"),
    ("LANG", "C.UTF-8"),
]


@pytest.mark.parametrize(("name", "value"), INHERITANCE, ids=[name for name, _ in INHERITANCE])
def test_base_slurm_identity_is_dropped_and_exported_environment_wins(name: str, value: str | None) -> None:
    env = job_environment(launch(environment=EXPORTED), PARENT_JOB, UID, GID)
    assert env.get(name) == value


def test_exported_slurm_variables_do_not_override_the_jobs_identity() -> None:
    exported = {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "64", "SLURM_RESTART_COUNT": "9"}
    env = job_environment(launch(environment=exported), {}, UID, GID)
    assert (env["SLURM_JOB_ID"], env["SLURM_NTASKS"], env["SLURM_RESTART_COUNT"]) == ("4242", "2", "0")


# --- output file patterns ---------------------------------------------------------------------

PATTERNS = [
    ("%j", f"{WORKDIR}/4242", "job-id"),
    ("%J", f"{WORKDIR}/4242", "job-id-J"),
    ("%A", f"{WORKDIR}/4242", "array-master-is-job-id"),
    ("%a", f"{WORKDIR}/{NO_ARRAY_INDEX}", "array-index-no-array"),
    ("%x", f"{WORKDIR}/train", "job-name"),
    ("%u", f"{WORKDIR}/alice", "user"),
    ("%N", f"{WORKDIR}/gpu01", "first-node"),
    ("%n", f"{WORKDIR}/0", "node-id"),
    ("%t", f"{WORKDIR}/0", "task-id"),
    ("%s", f"{WORKDIR}/batch", "step"),
    ("100%%", f"{WORKDIR}/100%", "percent-escape"),
    ("%%j", f"{WORKDIR}/%j", "escaped-percent-before-letter"),
    ("job%6j.out", f"{WORKDIR}/job004242.out", "zero-padding"),
    ("job%2j.out", f"{WORKDIR}/job4242.out", "padding-narrower-than-value"),
    ("%4x", f"{WORKDIR}/train", "padding-ignored-for-text"),
    ("%q.out", f"{WORKDIR}/%q.out", "unknown-kept-literally"),
    ("%3q", f"{WORKDIR}/%3q", "unknown-with-width-kept-literally"),
    ("out%", f"{WORKDIR}/out%", "trailing-percent"),
    ("logs/%x-%j.out", f"{WORKDIR}/logs/train-4242.out", "relative-dir-joined-to-workdir"),
    ("%u/%x_%A_%a.log", f"{WORKDIR}/alice/train_4242_{NO_ARRAY_INDEX}.log", "pattern-in-directory-part"),
    ("/scratch/%u/%j.out", "/scratch/alice/4242.out", "absolute-kept"),
]


@pytest.mark.parametrize(("pattern", "expected"), [p[:2] for p in PATTERNS], ids=[p[2] for p in PATTERNS])
def test_expand_pattern(pattern: str, expected: str) -> None:
    assert expand_pattern(pattern, launch()) == expected


def test_expand_pattern_pads_small_job_ids() -> None:
    assert expand_pattern("/o/%4j-%4A", launch(job_id=42)) == "/o/0042-0042"


def test_expand_pattern_caps_padding_at_ten_like_slurm() -> None:
    assert expand_pattern("/o/%12j", launch()) == "/o/0000004242"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, (f"{WORKDIR}/slurm-4242.out", None)),
        ({"stdout": "train-%j.log"}, (f"{WORKDIR}/train-4242.log", None)),
        ({"stdout": "o-%j", "stderr": "e-%j"}, (f"{WORKDIR}/o-4242", f"{WORKDIR}/e-4242")),
        ({"stderr": "err-%j"}, (f"{WORKDIR}/slurm-4242.out", f"{WORKDIR}/err-4242")),
        ({"stdout": "%x.%j", "stderr": "%x.%j"}, (f"{WORKDIR}/train.4242", None)),
        ({"stdout": "out-%j", "stderr": f"{WORKDIR}/out-%j"}, (f"{WORKDIR}/out-4242", None)),
    ],
    ids=[
        "default-slurm-j-out",
        "stdout-only",
        "both",
        "stderr-only-stdout-default",
        "same-pattern-merged",
        "same-path-after-expansion-merged",
    ],
)
def test_output_paths(spec: dict[str, str], expected: tuple[str, str | None]) -> None:
    assert output_paths(launch(**spec)) == expected


@pytest.mark.parametrize(("qos", "shown"), [(None, "normal"), ("high", "high")], ids=["unresolved", "high"])
def test_job_qos(qos: str | None, shown: str) -> None:
    assert job_environment(launch(qos=qos), {}, UID, GID)["SLURM_JOB_QOS"] == shown
