"""Node choice (-w, -x, -C, --exclusive) and the per-GPU options (--gpus-per-task, --cpus/mem-per-gpu)."""

from __future__ import annotations

import math

import pytest
from builders import Log, allocated, cluster, env, job, place, policy, registered, submitted

from corral.libs.core.backfill import Planner
from corral.libs.core.placement import Free, Request, free_capacity, request_of_spec
from corral.libs.core.plan import Plan, plan
from corral.libs.core.topology import fits_idle
from corral.schemas import events as ev
from corral.schemas.events import Constraint

pytestmark = pytest.mark.unit

POLICY = policy()


def cycle(log: Log) -> Plan:
    """Plan on the log's state and append the decisions, as the live scheduler does."""
    out = plan(log.state, log.state.now, POLICY, 0)
    log.add(*out.decisions)
    return out


def allocations(out: Plan) -> dict[int, list[ev.NodeAllocation]]:
    """Job id -> allocation of every JobAllocated in a plan."""
    return {d.job_id: d.allocations for d in out.decisions if isinstance(d, ev.JobAllocated)}


def free(
    name: str, gpus: int = 8, *, cpus: int = 64, features: tuple[str, ...] = (), idle: bool = True
) -> Free:
    """Free capacity of one node of partition "gpu" (1000M memory, h100 GPUs)."""
    return Free(name, list(range(gpus)), cpus, 1000, 1000, "h100", ("gpu",), idle=idle, features=features)


def frees(*nodes: Free) -> dict[str, Free]:
    """Free capacity by node name."""
    return {f.name: f for f in nodes}


def request(
    gpus: int = 1,
    nodes: int = 1,
    *,
    cpus: int = 1,
    nodelist: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    constraint: Constraint | None = None,
    exclusive: bool = False,
) -> Request:
    """A per-node request; ``constraint`` as sbatch parses it."""
    return Request(
        nodes=nodes,
        gpus=gpus,
        gpu_type=None,
        cpus=cpus,
        mem_mb=None,
        nodelist=nodelist,
        exclude=frozenset(exclude),
        features=tuple(constraint.features) if constraint else (),
        any_feature=constraint.any_of if constraint else False,
        exclusive=exclusive,
    )


def chosen(out: list[ev.NodeAllocation] | None) -> list[str] | None:
    """Node names of an allocation."""
    return None if out is None else [a.node for a in out]


ALL_OF = Constraint(features=["ib", "nvlink"])
ANY_OF = Constraint(features=["ib", "nvlink"], any_of=True)

#: n1 (8 GPUs, ib+nvlink), n2 (4 GPUs, ib), n3 (2 GPUs, nvlink), n4 (1 GPU, no features).
CHOICE = [
    (request(), ["n4"], "best fit without options"),
    (request(exclude=("n4",)), ["n3"], "excluded node skipped"),
    (request(exclude=("n1", "n2", "n3", "n4")), None, "everything excluded"),
    (request(constraint=Constraint(features=["ib"])), ["n2"], "one feature"),
    (request(constraint=ALL_OF), ["n1"], "all of"),
    (request(constraint=ANY_OF), ["n3"], "any of"),
    (request(constraint=ANY_OF, nodes=3), ["n1", "n2", "n3"], "any of, three nodes"),
    (request(constraint=Constraint(features=["gpu-x"])), None, "unknown feature"),
    (request(nodelist=("n1",)), ["n1"], "-w forces the listed node over a better fit"),
    (request(nodelist=("n1",), nodes=2), ["n1", "n4"], "-w plus one node chosen freely"),
    (request(nodelist=("n1", "n2"), nodes=2), ["n1", "n2"], "-w of exactly N nodes"),
    (request(gpus=4, nodelist=("n3",)), None, "a listed node too small"),
    (request(nodelist=("n1",), constraint=Constraint(features=["ib"]), nodes=2), ["n1", "n2"], "-w and -C"),
    (request(nodelist=("n9",)), None, "a listed node that is not there"),
]


@pytest.mark.parametrize(("req", "names"), [c[:2] for c in CHOICE], ids=[c[2] for c in CHOICE])
def test_eligible_nodes(req: Request, names: list[str] | None) -> None:
    def nodes() -> dict[str, Free]:
        return frees(
            free("n1", 8, features=("ib", "nvlink")),
            free("n2", 4, features=("ib",)),
            free("n3", 2, features=("nvlink",)),
            free("n4", 1),
        )

    assert chosen(Planner(nodes(), 0.0).start_now("gpu", req, 60.0)) == names
    assert fits_idle(list(nodes().values()), req, {}) == (names is not None)


def test_exclusive_takes_the_whole_idle_node() -> None:
    free_now = frees(free("n1", 8, cpus=64), free("n2", 4, cpus=32, idle=False))
    out = place(free_now, "gpu", request(gpus=1, exclusive=True))
    assert out == [ev.NodeAllocation(node="n1", gpus=list(range(8)), cpus=64, mem_mb=1000)]
    assert (free_now["n1"].gpus, free_now["n1"].cpus, free_now["n1"].mem_mb) == ([], 0, 0)
    # n2 runs something: an exclusive job never shares it, a CPU-only job no longer fits on n1.
    assert place(free_now, "gpu", request(gpus=0, exclusive=True)) is None
    assert chosen(place(free_now, "gpu", request(gpus=0))) == ["n2"]
    free_now["n2"].cpus = 0
    assert place(free_now, "gpu", request(gpus=0)) is None


def test_exclusive_job_blocks_others_through_the_fold() -> None:
    log = Log(*cluster(nodes=2, cpus=16, mem_mb=1000))
    log.add(submitted(1, job(gpus=1, nodes=1, exclusive=True, time_s=600)))
    out = cycle(log)
    [alloc] = allocations(out)[1]
    assert (alloc.gpus, alloc.cpus, alloc.mem_mb) == (list(range(8)), 16, 1000)
    node = log.state.nodes[alloc.node]
    assert (node.used_gpus, node.alloc_cpus, node.alloc_mem_mb) == (list(range(8)), 16, 1000)
    # A second single-core job goes to the other node; a third finds nothing.
    whole = job(gpus=0, nodes=1, cpus_per_task=16, time_s=600)
    log.add(submitted(2, whole), submitted(3, whole))
    out = cycle(log)
    assert chosen(allocations(out)[2]) != [alloc.node] and 3 not in allocations(out)
    # The fold also refuses a hand-made allocation on the exclusive job's node.
    log.add(submitted(4, job(gpus=0, nodes=1)), allocated(4, {alloc.node: []}, cpus=1))
    assert log.state.jobs[4].state == "PENDING"


def test_exclusive_waits_for_an_idle_node_and_is_reserved() -> None:
    log = Log(*cluster(nodes=1, cpus=16, mem_mb=1000))
    log.add(submitted(1, job(gpus=1, nodes=1, time_s=600)), allocated(1, {"gpu01": [0]}, time_s=600))
    log.add(submitted(2, job(gpus=1, nodes=1, exclusive=True, time_s=600)))
    out = plan(log.state, log.state.now, POLICY, 0)
    assert 2 not in allocations(out) and out.reasons[2] == "Resources"
    # EASY: the exclusive job holds the whole node from when job 1 ends, so a long job cannot backfill.
    log.add(submitted(3, job(gpus=1, nodes=1, time_s=6000)))
    assert 3 not in allocations(plan(log.state, log.state.now, POLICY, 0))


def test_reservation_includes_the_listed_nodes() -> None:
    busy = Free("n2", [], 63, 1000, 1000, "h100", ("gpu",), idle=False, total_cpus=64, total_gpus=8)
    planner = Planner(frees(free("n1"), busy, free("n3")), 0.0)
    planner.running([ev.NodeAllocation(node="n2", gpus=list(range(8)), cpus=1)], 100.0)
    req = request(gpus=8, nodes=2, nodelist=("n2",))
    assert planner.start_now("gpu", req, 60.0) is None
    assert planner.reserve("gpu", req, 60.0, math.inf) == 100.0
    held = {name for name, n in planner.nodes.items() if n.holds}
    assert "n2" in held and len(held) == 2


def test_free_capacity_carries_features_and_totals() -> None:
    log = Log(env(registered("gpu01", cpus=32, features=("nvlink",)), actor="agent"))
    assert free_capacity(log.state.nodes)["gpu01"] == Free(
        "gpu01", list(range(8)), 32, 512_000, 512_000, "h100", ("gpu",), features=("nvlink",)
    )


# (spec, (GPUs, CPUs, memory) per node, id)
PER_GPU = [
    (job(gpus=8, nodes=2, ntasks=8, gpus_per_task=2), (8, 4, None), "gpus-per-task: 4 tasks x 2"),
    (job(gpus=4, nodes=1, cpus_per_gpu=6), (4, 24, None), "cpus-per-gpu: 4 GPUs x 6"),
    (job(gpus=4, nodes=1, ntasks=32, cpus_per_gpu=2), (4, 32, None), "more CPUs for the tasks"),
    (job(gpus=2, nodes=1, mem_mb=2048), (2, 1, 2048), "mem-per-gpu arrives as memory per node"),
    (job(gpus=1, nodes=1, nodelist=["a", "b", "c"]), (1, 1, None), "-w raises the node count"),
]


@pytest.mark.parametrize(("spec", "shape"), [c[:2] for c in PER_GPU], ids=[c[2] for c in PER_GPU])
def test_per_node_arithmetic(spec: ev.JobSpec, shape: tuple[int, int, int | None]) -> None:
    req = request_of_spec(spec)
    assert (req.gpus, req.cpus, req.mem_mb) == shape
    assert req.nodes == max(spec.nodes, len(spec.nodelist))


def test_a_reservations_hold_on_a_node_with_no_cpu_free_still_counts() -> None:
    """Its hold waits until something reads that node's future (``Planner._hold``): a second reservation
    and a start that needs no CPU both see it."""
    busy = Free("n1", [0], 0, 1000, 1000, "h100", ("gpu",), idle=False, total_cpus=1, total_gpus=1)
    planner = Planner(frees(busy), 0.0)
    planner.running([ev.NodeAllocation(node="n1", gpus=[], cpus=1)], 100.0)
    assert planner.reserve("gpu", request(gpus=1, cpus=1), 100.0, math.inf) == 100.0  # [100, 200)
    # Its one GPU is free now but held from 100: a job of no CPU and 200 s would break the reservation.
    assert planner.start_now("gpu", request(gpus=1, cpus=0), 200.0) is None
    assert planner.start_now("gpu", request(gpus=1, cpus=0), 100.0) is not None
    second = Planner(frees(busy), 0.0)
    second.running([ev.NodeAllocation(node="n1", gpus=[], cpus=1)], 100.0)
    assert second.reserve("gpu", request(gpus=1, cpus=1), 100.0, math.inf) == 100.0
    assert second.reserve("gpu", request(gpus=1, cpus=1), 100.0, math.inf) == 200.0  # after the first
