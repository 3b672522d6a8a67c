"""Submit validation: a job that can never be accepted is refused with the field at fault."""

from __future__ import annotations

import msgspec
import pytest
from builders import cluster_config, job

from corral.libs.config.cluster import parse_config
from corral.libs.runtime.errors import InvalidInput
from corral.schemas.events import Constraint, JobSpec
from corral.services.gateway.validate import MAX_SCRIPT_BYTES, validate_spec

pytestmark = pytest.mark.unit

#: 16 nodes gpu01-16 (64 CPUs, 500G, 8 h100) in "gpu" (default, MaxTime 1 day); cpu01-02 in "cpu".
CONFIG = cluster_config(nodes=16, gpus=8)


GOOD = [
    (job(gpus=8, nodes=4), "whole GPU nodes"),
    (job(gpus=8, nodes=16, time_s=86_400), "the whole partition for MaxTime"),
    (job(gpus=1, nodes=1, gpu_type="h100", mem_mb=0), "typed, whole memory"),
    (job(gpus=0, nodes=2, partition="cpu", ntasks=32), "CPU partition, all CPUs"),
    (job(gpus=0, nodes=1, ntasks=8, cpus_per_task=8, mem_mb=500 * 1024), "all CPUs and memory of a node"),
]


@pytest.mark.parametrize("spec", [c[0] for c in GOOD], ids=[c[1] for c in GOOD])
def test_a_good_spec_passes(spec: JobSpec) -> None:
    validate_spec(spec, CONFIG)


def bad(**fields: object) -> JobSpec:
    """The default job with some fields replaced."""
    return msgspec.structs.replace(job(), **fields)


BAD = [
    (bad(script="echo hi\n"), "script", "no shebang"),
    (bad(script="#!/bin/sh\n" + "x" * MAX_SCRIPT_BYTES), "script", "huge script"),
    (bad(name=""), "name", "empty name"),
    (bad(name="a\nb"), "name", "name on two lines"),
    (bad(environment={"X": "y" * (1024 * 1024)}), "environment", "huge environment"),
    (bad(argv=["a"] * 1025), "argv", "too many arguments"),
    (bad(workdir="run/here"), "workdir", "relative workdir"),
    (bad(nodes=0), "nodes", "nodes 0"),
    (bad(ntasks=0), "ntasks", "ntasks 0"),
    (bad(cpus_per_task=0), "cpus_per_task", "cpus per task 0"),
    (bad(gpus_per_node=-1), "gpus_per_node", "negative GPUs"),
    (bad(ntasks_per_node=0), "ntasks_per_node", "ntasks per node 0"),
    (bad(mem_per_node_mb=-1), "mem_per_node_mb", "negative memory"),
    (bad(time_limit_s=0), "time_limit_s", "time 0"),
    (bad(partition="nope"), "partition", "unknown partition"),
    (bad(time_limit_s=86_401), "time_limit_s", "time over MaxTime"),
    (bad(nodes=17, ntasks=17), "nodes", "more nodes than the partition"),
]


@pytest.mark.parametrize(("spec", "field"), [c[:2] for c in BAD], ids=[c[2] for c in BAD])
def test_a_bad_field_is_named(spec: JobSpec, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_spec(spec, CONFIG)
    assert raised.value.field == field


UNSATISFIABLE = [
    (bad(gpus_per_node=9), "gpus_per_node", "more GPUs than any node has"),
    (bad(gpu_type="a100"), "gpu_type", "GPU type no node has"),
    (bad(cpus_per_task=65), "cpus_per_task", "more CPUs than any node has"),
    (bad(mem_per_node_mb=600 * 1024), "mem_per_node_mb", "more memory than any node has"),
]


@pytest.mark.parametrize("spec", [c[0] for c in UNSATISFIABLE], ids=[c[2] for c in UNSATISFIABLE])
def test_a_job_that_can_never_run_is_refused(spec: JobSpec) -> None:
    with pytest.raises(InvalidInput, match=r"can never run: .* partition gpu"):
        validate_spec(spec, CONFIG)


@pytest.mark.parametrize(("spec", "field"), [c[:2] for c in UNSATISFIABLE], ids=[c[2] for c in UNSATISFIABLE])
def test_a_job_that_can_never_run_names_the_field_at_fault(spec: JobSpec, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_spec(spec, CONFIG)
    assert raised.value.field == field


def test_the_default_partition_is_used_without_one() -> None:
    # Without -p the job goes to "gpu"; the same CPU job fits "cpu" only when asked for.
    cpu_job = job(gpus=0, nodes=2, partition="cpu")
    validate_spec(cpu_job, CONFIG)
    with pytest.raises(InvalidInput) as raised:
        validate_spec(msgspec.structs.replace(cpu_job, partition=None, time_limit_s=86_401), CONFIG)
    assert raised.value.field == "time_limit_s"
    validate_spec(msgspec.structs.replace(cpu_job, time_limit_s=10 * 86_400), CONFIG)  # cpu: UNLIMITED


#: gpu01-04 with the feature "nvlink" (64 CPUs, 500G, 8 h100 each).
FEATURED = cluster_config(nodes=4, gpus=8, features=("nvlink",))
EVERY_GPU_NODE = [f"gpu{i:02d}" for i in range(1, 5)]

NODE_CHOICE_GOOD = [
    (job(gpus=8, nodes=2, nodelist=["gpu01", "gpu03"]), "-w two nodes"),
    (job(gpus=8, nodes=4, nodelist=["gpu04"]), "-w one node of four"),
    (job(gpus=1, nodes=3, exclude=["gpu02"]), "-x leaves enough"),
    (job(gpus=1, nodes=1, constraint=Constraint(features=["nvlink"])), "-C a feature nodes have"),
    (job(gpus=1, nodes=1, constraint=Constraint(features=["ib", "nvlink"], any_of=True)), "-C any of"),
    (job(gpus=1, nodes=4, exclusive=True), "--exclusive on every node"),
    (job(gpus=4, nodes=1, cpus_per_gpu=16), "cpus-per-gpu up to the node's CPUs"),
    (job(gpus=8, nodes=1, ntasks=4, gpus_per_task=2), "gpus-per-task"),
]


@pytest.mark.parametrize("spec", [c[0] for c in NODE_CHOICE_GOOD], ids=[c[1] for c in NODE_CHOICE_GOOD])
def test_node_choice_that_can_run_passes(spec: JobSpec) -> None:
    validate_spec(spec, FEATURED)


NODE_CHOICE_BAD = [
    (bad(nodes=1, exclude=EVERY_GPU_NODE), "exclude", "everything excluded"),
    (bad(nodes=2, exclude=EVERY_GPU_NODE[:3]), "nodes", "too few left after -x"),
    (bad(nodes=1, nodelist=["gpu01"], exclude=["gpu01"]), "exclude", "a node both listed and excluded"),
    (bad(nodes=1, nodelist=["cpu01"]), "nodelist", "a listed node of another partition"),
    (bad(nodes=1, nodelist=["nope"]), "nodelist", "a listed node that does not exist"),
    (bad(nodes=1, nodelist=[""]), "nodelist", "an empty node name"),
    (bad(nodes=1, constraint=Constraint(features=["ib"])), "constraint", "unknown feature"),
    (bad(nodes=1, constraint=Constraint(features=["ib", "nvlink"])), "constraint", "all of, one missing"),
    (bad(nodes=1, constraint=Constraint(features=[])), "constraint", "empty constraint"),
    (bad(nodes=1, gpus_per_node=4, cpus_per_gpu=17), "cpus_per_gpu", "cpus-per-gpu over the node's CPUs"),
    (bad(nodes=1, gpus_per_task=0), "gpus_per_task", "gpus-per-task 0"),
    (bad(nodes=1, cpus_per_gpu=0), "cpus_per_gpu", "cpus-per-gpu 0"),
]


@pytest.mark.parametrize(
    ("spec", "field"), [c[:2] for c in NODE_CHOICE_BAD], ids=[c[2] for c in NODE_CHOICE_BAD]
)
def test_node_choice_that_can_never_run_names_the_field(spec: JobSpec, field: str) -> None:
    with pytest.raises(InvalidInput) as raised:
        validate_spec(spec, FEATURED)
    assert raised.value.field == field


def test_a_listed_node_that_cannot_host_the_job_is_named() -> None:
    # gpu01 has nvlink, gpu02 has not: -C nvlink fits the partition, but not with -w gpu02.
    config = parse_config(
        """
[cluster]
name = "test"

[[nodes]]
names = "gpu01"
cpus = 8
memory = "8G"
features = ["nvlink"]

[[nodes]]
names = "gpu02"
cpus = 8
memory = "8G"

[[partitions]]
name = "gpu"
nodes = "gpu[01-02]"
default = true
"""
    )
    spec = job(gpus=0, nodes=1, constraint=Constraint(features=["nvlink"]))
    validate_spec(spec, config)
    with pytest.raises(InvalidInput) as raised:
        validate_spec(msgspec.structs.replace(spec, nodelist=["gpu02"]), config)
    assert raised.value.field == "nodelist"


NUL = [
    (bad(script="#!/bin/sh\necho a\x00b\n"), "script"),
    (bad(name="a\x00b"), "name"),
    (bad(workdir="/home/\x00"), "workdir"),
    (bad(argv=["ok", "a\x00"]), "argv"),
    (bad(environment={"A": "b\x00"}), "environment"),
    (bad(environment={"A\x00": "b"}), "environment"),
    (bad(stdout="out\x00.txt"), "stdout"),
    (bad(stderr="\x00"), "stderr"),
    (bad(account="a\x00"), "account"),
    (bad(partition="gpu\x00"), "partition"),
    (bad(qos="normal\x00"), "qos"),
    (bad(reservation="r\x00"), "reservation"),
    (bad(wckey="w\x00"), "wckey"),
]


@pytest.mark.parametrize(("spec", "field"), NUL, ids=[c[1] for c in NUL])
def test_a_nul_byte_in_any_text_is_refused_naming_the_field(spec: JobSpec, field: str) -> None:
    # The gateway is the trust boundary: an API client need not use sbatch, and a NUL byte would fail the
    # job at launch (a path or an argument the kernel cannot take).
    with pytest.raises(InvalidInput) as refused:
        validate_spec(spec, CONFIG)
    assert refused.value.field == field
    assert "NUL byte" in str(refused.value)


CONTROL = [
    (bad(nodelist=["gpu01\n"]), "nodelist"),
    (bad(partition="gpu\t"), "partition"),
    (bad(account="a\x1b[2J"), "account"),
    (bad(constraint=Constraint(features=["nv\u2028link"])), "constraint"),
]


@pytest.mark.parametrize(("spec", "field"), CONTROL, ids=[c[1] for c in CONTROL])
def test_a_name_with_a_control_character_is_refused_on_one_line(spec: JobSpec, field: str) -> None:
    # A refusal names what it refuses: a name holding a line break would make it two lines.
    with pytest.raises(InvalidInput) as refused:
        validate_spec(spec, CONFIG)
    assert refused.value.field == field
    assert "control character" in str(refused.value) and "\n" not in str(refused.value)


def test_a_reloaded_configuration_gets_its_own_answer_whatever_an_earlier_one_said() -> None:
    """Whether a job fits the idle partition is kept per configuration and request: a configuration with
    bigger nodes accepts what the earlier one refused, and the earlier one still refuses it."""
    wide = job(gpus=16, nodes=1)
    small, big = cluster_config(nodes=4, gpus=8), cluster_config(nodes=4, gpus=16)
    for _ in range(2):
        with pytest.raises(InvalidInput) as refused:
            validate_spec(wide, small)
        assert refused.value.field == "gpus_per_node"
        validate_spec(wide, big)
        validate_spec(job(gpus=8, nodes=4), small)
        with pytest.raises(InvalidInput, match="5 nodes requested"):
            validate_spec(job(gpus=8, nodes=5), small)
