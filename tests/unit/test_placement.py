"""Placement: best fit, lowest GPU indices, typed GPUs, whole-node memory and CPU limits."""

from __future__ import annotations

import pytest
from builders import Log, allocated, cluster, job, place, submitted

from corral.libs.core.placement import Free, Request, free_capacity, request_of
from corral.libs.core.state import Job
from corral.libs.core.topology import fits_idle
from corral.schemas import events as ev

pytestmark = pytest.mark.unit


def free(
    name: str,
    gpus: int | list[int] = 8,
    *,
    cpus: int = 64,
    mem_mb: int = 1000,
    total_mem_mb: int = 1000,
    gpu_type: str | None = "h100",
    partitions: tuple[str, ...] = ("gpu",),
) -> Free:
    """Free capacity of one node: ``gpus`` free indices (a count means 0..n-1)."""
    indices = list(range(gpus)) if isinstance(gpus, int) else gpus
    return Free(name, indices, cpus, mem_mb, total_mem_mb, gpu_type, partitions)


def nodes(*frees: Free) -> dict[str, Free]:
    """Free capacity by node name."""
    return {f.name: f for f in frees}


def request(
    gpus: int = 1, nodes: int = 1, cpus: int = 1, gpu_type: str | None = None, mem_mb: int | None = None
) -> Request:
    """A per-node request."""
    return Request(nodes=nodes, gpus=gpus, gpu_type=gpu_type, cpus=cpus, mem_mb=mem_mb)


def chosen(out: list[ev.NodeAllocation] | None) -> list[str] | None:
    """Node names of an allocation."""
    return None if out is None else [a.node for a in out]


BEST_FIT = [
    (request(gpus=2), ["n3"], "fewest free GPUs that still fit"),
    (request(gpus=4), ["n5"], "skips nodes too small"),
    (request(gpus=8), ["n8"], "only the whole node fits"),
    (request(gpus=0), ["n3"], "CPU-only job keeps big GPU nodes free"),
    (request(gpus=3, nodes=2), ["n3", "n5"], "multi-node in name order"),
    (request(gpus=9), None, "too many GPUs"),
    (request(gpus=1, nodes=4), None, "too many nodes"),
]


@pytest.mark.parametrize(("req", "names"), [c[:2] for c in BEST_FIT], ids=[c[2] for c in BEST_FIT])
def test_best_fit(req: Request, names: list[str] | None) -> None:
    free_now = nodes(free("n8", 8), free("n3", 3), free("n5", 5))
    assert chosen(place(free_now, "gpu", req)) == names


def test_ties_go_to_fewer_free_cpus_then_name() -> None:
    free_now = nodes(free("b", 4, cpus=8), free("a", 4, cpus=8), free("c", 4, cpus=4))
    assert chosen(place(free_now, "gpu", request(cpus=2))) == ["c"]
    assert chosen(place(free_now, "gpu", request(cpus=8))) == ["a"]


def test_lowest_free_gpu_indices_and_capacity_taken() -> None:
    free_now = nodes(free("n1", [1, 3, 4, 6, 7], cpus=8, mem_mb=1000))
    first = place(free_now, "gpu", request(gpus=3, cpus=2, mem_mb=300))
    assert first == [ev.NodeAllocation(node="n1", gpus=[1, 3, 4], cpus=2, mem_mb=300)]
    assert (free_now["n1"].gpus, free_now["n1"].cpus, free_now["n1"].mem_mb) == ([6, 7], 6, 700)
    second = place(free_now, "gpu", request(gpus=2))
    assert second is not None and second[0].gpus == [6, 7]
    assert place(free_now, "gpu", request(gpus=1)) is None


def test_a_request_that_does_not_fit_takes_nothing() -> None:
    free_now = nodes(free("n1", 8), free("n2", 8))
    assert place(free_now, "gpu", request(gpus=4, nodes=3)) is None
    assert [f.gpus for f in free_now.values()] == [list(range(8)), list(range(8))]


TYPED = [
    (request(gpus=2, gpu_type="a100"), ["a1"], "typed request on its type only"),
    (request(gpus=4, gpu_type="h100"), None, "no node of that type has room"),
    (request(gpus=2, gpu_type="b200"), None, "unknown type"),
    (request(gpus=2), ["h1"], "untyped request takes any type"),
    (request(gpus=0, gpu_type="b200"), ["cpu1"], "type is ignored without GPUs"),
]


@pytest.mark.parametrize(("req", "names"), [c[:2] for c in TYPED], ids=[c[2] for c in TYPED])
def test_typed_gpu_requests(req: Request, names: list[str] | None) -> None:
    free_now = nodes(free("a1", 8, gpu_type="a100"), free("h1", 2), free("cpu1", 0, gpu_type=None))
    assert chosen(place(free_now, "gpu", req)) == names


WHOLE_NODE = [
    (free("n1", 8, mem_mb=1000, total_mem_mb=1000), 1000, "idle node: all its memory"),
    (free("n1", 8, mem_mb=999, total_mem_mb=1000), None, "some memory taken"),
]


@pytest.mark.parametrize(("node", "mem"), [c[:2] for c in WHOLE_NODE], ids=[c[2] for c in WHOLE_NODE])
def test_mem_zero_takes_all_memory_of_an_idle_node(node: Free, mem: int | None) -> None:
    free_now = nodes(node)
    out = place(free_now, "gpu", request(gpus=1, mem_mb=0))
    assert (out[0].mem_mb if out else None) == mem
    if out:
        assert free_now["n1"].mem_mb == 0
        assert place(free_now, "gpu", request(gpus=1, mem_mb=1)) is None


def test_mem_zero_does_not_take_a_node_with_running_jobs() -> None:
    log = Log(*cluster(nodes=1))
    log.add(submitted(1, job(gpus=2, nodes=1)), allocated(1, {"gpu01": [0, 1]}, cpus=2, mem_mb=0))
    free_now = free_capacity(log.state.nodes)
    assert place(free_now, "gpu", request(gpus=1, mem_mb=0)) is None


CPUS = [
    (request(gpus=0, cpus=16), ["n1"], "exactly the free CPUs"),
    (request(gpus=0, cpus=17), None, "one CPU more than free"),
    (request(gpus=0, cpus=8, nodes=2), ["n1", "n2"], "per node on each node"),
    (request(gpus=0, cpus=9, nodes=2), None, "second node too small"),
    (request(gpus=0, mem_mb=600), ["n2"], "all the free memory"),
    (request(gpus=0, mem_mb=601), None, "more memory than free"),
]


@pytest.mark.parametrize(("req", "names"), [c[:2] for c in CPUS], ids=[c[2] for c in CPUS])
def test_cpu_and_memory_limits(req: Request, names: list[str] | None) -> None:
    free_now = nodes(free("n1", 0, cpus=16, mem_mb=600), free("n2", 0, cpus=8, mem_mb=600))
    assert chosen(place(free_now, "gpu", req)) == names


def test_only_nodes_of_the_partition() -> None:
    free_now = nodes(free("n1", 1, partitions=("debug",)), free("n2", 8, partitions=("gpu", "debug")))
    assert chosen(place(free_now, "gpu", request(gpus=1))) == ["n2"]
    assert chosen(place(free_now, "debug", request(gpus=1))) == ["n1"]
    assert place(free_now, "nope", request(gpus=0)) is None


def test_free_capacity_of_registered_nodes() -> None:
    log = Log(*cluster(nodes=3, cpus=32, mem_mb=1000))
    log.add(submitted(1, job(gpus=3, nodes=1)))
    log.add(allocated(1, {"gpu02": [0, 2, 5]}, cpus=4, mem_mb=100))
    log.add(ev.NodeDown(node="gpu03", reason="Not responding"))
    out = free_capacity(log.state.nodes)
    assert list(out) == ["gpu01", "gpu02"]  # up nodes only
    assert out["gpu02"] == Free(
        "gpu02", [1, 3, 4, 6, 7], 28, 900, 1000, "h100", ("gpu",), idle=False, total_cpus=32, total_gpus=8
    )


REQUESTS = [
    (job(gpus=8, nodes=4), Request(4, 8, None, 1, None), "one task per node"),
    (job(gpus=0, nodes=2, ntasks=8, cpus_per_task=4), Request(2, 0, None, 16, None), "tasks spread"),
    (job(gpus=0, nodes=2, ntasks=3), Request(2, 0, None, 2, None), "tasks round up"),
    (job(gpus=2, nodes=2, ntasks_per_node=3, cpus_per_task=2), Request(2, 2, None, 6, None), "per node"),
    (job(gpus=4, nodes=1, gpu_type="a100", mem_mb=0), Request(1, 4, "a100", 1, 0), "type and whole node"),
]


@pytest.mark.parametrize(("spec", "req"), [c[:2] for c in REQUESTS], ids=[c[2] for c in REQUESTS])
def test_request_of(spec: ev.JobSpec, req: Request) -> None:
    assert request_of(Job(job_id=1, user="alice", spec=spec, submit_time=0.0)) == req


def test_fits_idle_counts_idle_nodes() -> None:
    idle = [free("n1", 8), free("n2", 4, gpu_type="a100")]
    assert fits_idle(idle, request(gpus=4, nodes=2), {})
    assert not fits_idle(idle, request(gpus=8, nodes=2), {})
    assert not fits_idle(idle, request(gpus=4, nodes=2, gpu_type="a100"), {})
