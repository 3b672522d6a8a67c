"""Topology-aware placement: fewest blocks, best fit, --switches (with its wait) and --segment."""

from __future__ import annotations

import dataclasses

import pytest
from builders import T0, Log, allocated, cluster, job, policy, submitted
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.libs.core.placement import Free, Request
from corral.libs.core.plan import Plan, plan
from corral.libs.core.policy import Policy
from corral.libs.core.topology import Topology, choose
from corral.schemas import events as ev

pytestmark = pytest.mark.unit

#: Blocks of the test cluster: A = gpu01-04, B = gpu05-08, C = gpu09-10 (8 GPUs per node).
BLOCKS = {f"gpu{i:02d}": "A" if i <= 4 else "B" if i <= 8 else "C" for i in range(1, 11)}
TOPO = dataclasses.replace(policy(), blocks=BLOCKS)


def busy_log(busy: dict[str, int], nodes: int = 10, time_s: int = 3600) -> Log:
    """A cluster of ``nodes`` nodes where a running job holds ``busy[node]`` GPUs of each listed node."""
    log = Log(*cluster(nodes=nodes, gpus=8))
    for job_id, (node, gpus) in enumerate(sorted(busy.items()), start=100):
        log.add(submitted(job_id, job(gpus=gpus, nodes=1, time_s=time_s)))
        log.add(allocated(job_id, {node: list(range(gpus))}, time_s=time_s))
    return log


def run(log: Log, pol: Policy) -> Plan:
    out = plan(log.state, log.state.now, pol)
    log.add(*out.decisions, step=0.0)
    return out


def placed(out: Plan, job_id: int) -> list[str] | None:
    for d in out.decisions:
        if isinstance(d, ev.JobAllocated) and d.job_id == job_id:
            return sorted(a.node for a in d.allocations)
    return None


def names(*numbers: int) -> list[str]:
    return [f"gpu{i:02d}" for i in numbers]


# (busy GPUs by node, the job, expected nodes (None: pending), id)
CASES = [
    ({"gpu05": 8}, job(gpus=8, nodes=3), names(6, 7, 8), "topology choosing one block when one fits"),
    ({"gpu05": 8}, job(gpus=8, nodes=4), names(1, 2, 3, 4), "one whole idle block for a block-sized job"),
    ({"gpu01": 8}, job(gpus=8, nodes=6), names(5, 6, 7, 8, 9, 10), "fewest blocks when none fits alone"),
    (
        {"gpu07": 8, "gpu08": 8},
        job(gpus=8, nodes=2),
        names(5, 6),
        "least fragmentation: the half-used block, idle blocks stay whole",
    ),
    ({"gpu06": 8}, job(gpus=8, nodes=1), names(5), "a single-node job prefers a partly used block"),
    ({"gpu06": 4}, job(gpus=2, nodes=1), names(6), "a small job shares the partly used node"),
    ({}, job(gpus=8, nodes=10), names(*range(1, 11)), "the whole cluster spans every block"),
    ({"gpu01": 8, "gpu05": 8}, job(gpus=8, nodes=4, switches=1), None, "--switches=1 waits for one block"),
    ({"gpu01": 8}, job(gpus=8, nodes=4, switches=1), names(5, 6, 7, 8), "--switches=1 takes the free block"),
    ({"gpu01": 8}, job(gpus=8, nodes=6, switches=2), names(5, 6, 7, 8, 9, 10), "--switches=2 is enough"),
    (
        {"gpu01": 8, "gpu05": 8},
        job(gpus=8, nodes=4, segment=2),
        names(2, 3, 6, 7),
        "--segment=2: two segments, each inside a block, the idle block C stays whole",
    ),
    (
        {"gpu01": 8, "gpu05": 8},
        job(gpus=8, nodes=6, segment=3),
        names(2, 3, 4, 6, 7, 8),
        "--segment=3: one segment in each 3-node remainder",
    ),
    ({"gpu01": 8, "gpu05": 8}, job(gpus=8, nodes=4, segment=4), None, "--segment=4: no block has 4 free"),
    (
        {"gpu01": 8},
        job(gpus=8, nodes=3, nodelist=["gpu09"]),
        names(2, 9, 10),
        "-w: the listed node's block first, the rest by best fit",
    ),
]


@pytest.mark.parametrize(("busy", "spec", "expected"), [c[:3] for c in CASES], ids=[c[3] for c in CASES])
def test_placement(busy: dict[str, int], spec: ev.JobSpec, expected: list[str] | None) -> None:
    log = busy_log(busy)
    log.add(submitted(1, spec))
    out = run(log, TOPO)
    assert placed(out, 1) == expected
    if expected is None:
        assert out.reasons[1] == "Resources"


def test_without_blocks_every_node_is_its_own_block() -> None:
    """No [[blocks]]: choices are the plain best fit by name; --switches caps the node count."""
    log = busy_log({"gpu05": 8})
    log.add(submitted(1, job(gpus=8, nodes=3)), submitted(2, job(gpus=8, nodes=2, switches=1)))
    out = run(log, policy())
    assert placed(out, 1) == names(1, 2, 3) and placed(out, 2) is None


@pytest.mark.parametrize(
    ("spec", "max_wait", "waits_s"),
    [
        (job(gpus=8, nodes=4, switches=1), 300, 300),
        (job(gpus=8, nodes=4, switches=1, switches_wait_s=60), 300, 60),
        (job(gpus=8, nodes=4, switches=1, switches_wait_s=3600), 300, 300),
        (job(gpus=8, nodes=4, switches=1, switches_wait_s=0), 300, 0),
        (job(gpus=8, nodes=4, switches=1), 0, 0),
    ],
    ids=["default max_switch_wait", "@60", "@1h capped by max_switch_wait", "@0", "max_switch_wait=0"],
)
def test_switches_wait_then_spread(spec: ev.JobSpec, max_wait: int, waits_s: int) -> None:
    """--switches=1 keeps the job pending (Resources) rather than spreading, until the wait lapses."""
    pol = dataclasses.replace(TOPO, max_switch_wait_s=max_wait)
    log = busy_log({"gpu01": 8, "gpu05": 8})
    log.add(submitted(1, spec))
    submit = log.state.jobs[1].submit_time
    if waits_s:
        early = plan(log.state, submit + waits_s - 1, pol)
        assert placed(early, 1) is None and early.reasons[1] == "Resources"
        assert early.wake_at == submit + waits_s
    late = plan(log.state, submit + waits_s, pol)
    assert placed(late, 1) is not None and len({BLOCKS[n] for n in placed(late, 1) or []}) == 2


def test_switch_wait_counts_from_the_begin_time() -> None:
    log = busy_log({"gpu01": 8, "gpu05": 8})
    log.add(submitted(1, job(gpus=8, nodes=4, switches=1, switches_wait_s=60, begin_time=T0 + 1000)))
    assert placed(plan(log.state, T0 + 1059, TOPO), 1) is None
    assert placed(plan(log.state, T0 + 1060, TOPO), 1) is not None


def test_reservations_respect_switches() -> None:
    """Four nodes over two blocks are free at +100, a whole block only at +1000: --switches=1 waits."""
    log = Log(*cluster(nodes=8, gpus=8))
    running = [("gpu01", 1000), ("gpu05", 100), ("gpu06", 2000), ("gpu07", 2000), ("gpu08", 2000)]
    for job_id, (node, limit) in enumerate(running, start=100):
        log.add(submitted(job_id, job(gpus=8, nodes=1, time_s=limit)), step=0.0)
        log.add(allocated(job_id, {node: list(range(8))}, time_s=limit), step=0.0)
    t = log.state.now
    log.add(submitted(1, job(gpus=8, nodes=4, time_s=500, switches=1, switches_wait_s=86_400)), step=0.0)
    log.add(submitted(2, job(gpus=8, nodes=4, time_s=500)), step=0.0)
    pol = dataclasses.replace(TOPO, backfill="conservative", max_switch_wait_s=86_400)
    out = plan(log.state, t, pol)
    assert out.starts == {1: t + 1000, 2: t + 100}
    # The reserved block is A: a job that would still run at +1000 may not start on gpu02-04 now.
    log.add(submitted(3, job(gpus=8, nodes=1, time_s=5000)), step=0.0)
    assert placed(plan(log.state, t, pol), 3) is None


def free(name: str, gpus: int = 8) -> Free:
    return Free(name, list(range(gpus)), 64, 512_000, 512_000, "h100", ("gpu",))


@pytest.mark.parametrize(
    ("req", "expected"),
    [
        (Request(nodes=2, gpus=8, gpu_type=None, cpus=1, mem_mb=None), ["b1", "b2"]),
        (Request(nodes=3, gpus=8, gpu_type=None, cpus=1, mem_mb=None), ["a1", "a2", "a3"]),
        (Request(nodes=4, gpus=8, gpu_type=None, cpus=1, mem_mb=None), ["a1", "a2", "a3", "b1"]),
        (Request(nodes=4, gpus=8, gpu_type=None, cpus=1, mem_mb=None, switches=1), None),
        (Request(nodes=4, gpus=8, gpu_type=None, cpus=1, mem_mb=None, segment=2), ["b1", "b2", "a1", "a2"]),
        (Request(nodes=3, gpus=8, gpu_type=None, cpus=1, mem_mb=None, segment=2), None),
        (Request(nodes=2, gpus=8, gpu_type=None, cpus=1, mem_mb=None, nodelist=("a3",)), ["a3", "a1"]),
    ],
    ids=["best fit", "one block", "fewest blocks", "switches", "segment", "not a multiple", "nodelist"],
)
def test_choose(req: Request, expected: list[str] | None) -> None:
    fit = [free(n) for n in ("a1", "a2", "a3", "b1", "b2")]
    blocks = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B"}
    chosen = choose(fit, req, Topology.of(blocks), lambda f: f)
    assert (None if chosen is None else [f.name for f in chosen]) == expected


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 4),
            st.sampled_from([1, 2, 4, 8]),
            st.integers(10, 300),
            st.sampled_from([None, 1, 2]),
            st.sampled_from([None, 1, 2]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_gpu_indices_are_never_shared(jobs: list[tuple[int, int, int, int | None, int | None]]) -> None:
    """Whatever the topology rules choose, no GPU index of a node is held by two running jobs."""
    log = Log(*cluster(nodes=10, gpus=8))
    for i, (nodes, gpus, limit, switches, segment) in enumerate(jobs, start=1):
        seg = segment if segment and nodes % segment == 0 else None
        spec = job(gpus=gpus, nodes=nodes, time_s=limit, switches=switches, segment=seg)
        log.add(submitted(i, spec), step=0.0)
    for _ in range(30):
        out = run(log, TOPO)
        for decision in out.decisions:
            if isinstance(decision, ev.JobAllocated):
                segment = log.state.jobs[decision.job_id].spec.segment or 1
                per_block: dict[str, int] = {}
                for a in decision.allocations:
                    per_block[BLOCKS[a.node]] = per_block.get(BLOCKS[a.node], 0) + 1
                assert all(n % segment == 0 for n in per_block.values())
        held: dict[str, list[int]] = {}
        for j in log.state.jobs.values():
            if j.state == "RUNNING":
                for a in j.allocations:
                    held.setdefault(a.node, []).extend(a.gpus)
        assert all(len(g) == len(set(g)) for g in held.values())
        running = [j for j in log.state.jobs.values() if j.state == "RUNNING"]
        log.add(
            *(
                ev.RunExited(job_id=j.job_id, attempt=0, node=j.allocations[0].node, exit_code=0)
                for j in running
            ),
            step=50.0,
        )
