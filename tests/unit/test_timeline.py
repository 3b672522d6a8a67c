"""A node's plan over time: the earliest start of a request on a node with holds is what its definition says
(the first of now, a release or a hold's end from which ``fits_during`` holds), on random plans; and the
planner's profiles kept by node state change no plan."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from builders import Log, allocated, cluster, job, policy, submitted
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.libs.core import plan as plan_module
from corral.libs.core.backfill import Planner
from corral.libs.core.placement import Free, Request, need
from corral.libs.core.plan import plan
from corral.libs.core.timeline import INF, Hold, NodePlan, Profile, Release

pytestmark = pytest.mark.unit

NOW = 1000.0


def defined_earliest(node: NodePlan, req: Request, now: float, limit: float) -> float:
    """The definition: every time the node's free capacity grows, in order, checked with ``fits_during``."""
    candidates = sorted(
        {
            now,
            *(r.when for r in node.releases if r.when > now),
            *(h.end for h in node.holds + node.resv if now < h.end < INF),
        }
    )
    for t in candidates:
        if node.fits_during(req, t, t + limit):
            return t
    return INF


# Times on a coarse grid, so that releases, starts and ends often fall together (and on ``now``).
times = st.integers(0, 12).map(lambda k: NOW - 200.0 + 100.0 * k)
amounts = st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4))


@st.composite
def holds(draw: st.DrawFn, resv: str | None = None) -> Hold:
    start = draw(times)
    end = draw(st.one_of(st.just(INF), times.filter(lambda t: t > start)))
    c, g, m = draw(amounts)
    return Hold(start, end, c, g, m * 100, resv)


@st.composite
def node_plans(draw: st.DrawFn) -> NodePlan:
    cpus, gpus, mem = draw(amounts)
    free = Free("n1", list(range(gpus)), cpus, mem * 100, 1000, None, ("p",), total_cpus=16, total_gpus=8)
    releases = sorted(
        Release(draw(st.one_of(times, st.just(0.0))), c, g, m * 100)
        for c, g, m in draw(st.lists(amounts, max_size=4))
    )
    planned = draw(st.lists(holds(), min_size=1, max_size=4))
    return NodePlan(free, releases, planned, draw(st.lists(holds("maint"), max_size=2)))


@settings(max_examples=600, deadline=None)
@given(
    node=node_plans(),
    want=amounts,
    limit=st.one_of(st.just(INF), st.just(0.0), st.integers(1, 1000).map(float)),
)
def test_the_earliest_start_on_a_held_node_is_the_first_time_it_fits(
    node: NodePlan, want: tuple[int, int, int], limit: float
) -> None:
    req = Request(nodes=1, gpus=want[1], gpu_type=None, cpus=want[0], mem_mb=want[2] * 100)
    assert node.earliest(req, NOW, limit) == defined_earliest(node, req, NOW, limit)


@settings(max_examples=600, deadline=None)
@given(
    node=node_plans(),
    want=amounts,
    limit=st.one_of(st.just(INF), st.just(0.0), st.integers(1, 1000).map(float)),
    horizon=st.one_of(st.just(INF), times),
)
def test_a_held_nodes_windows_open_again_where_the_definition_says(
    node: NodePlan, want: tuple[int, int, int], limit: float, horizon: float
) -> None:
    """After the earliest start, a window opens again at a time the node fits from, having not fitted just
    before it (on this grid, half a second before)."""
    req = Request(nodes=1, gpus=want[1], gpu_type=None, cpus=want[0], mem_mb=want[2] * 100)
    first = defined_earliest(node, req, NOW, limit)
    candidates = sorted(
        {
            *(r.when for r in node.releases if r.when > first),
            *(h.end for h in node.holds + node.resv if first < h.end < INF),
        }
    )
    defined = [
        t
        for t in candidates
        if t <= horizon
        and node.fits_during(req, t, t + limit)
        and not node.fits_during(req, t - 0.5, t - 0.5 + limit)
    ]
    profile = Profile(node, NOW)
    assert profile.reopens(need(node.free, req), limit, first, horizon) == defined


def test_a_hold_that_ends_later_moves_the_start_past_it_and_one_over_before_now_does_not() -> None:
    free = Free("n1", [0, 1], 2, 100, 100, None, ("p",))
    req = Request(nodes=1, gpus=2, gpu_type=None, cpus=1, mem_mb=10)
    over = Hold(NOW - 100, NOW, 2, 2, 10)  # ended at now: holds nothing
    later = Hold(NOW + 50, NOW + 80, 1, 1, 10)  # takes a GPU over [now + 50, now + 80)
    node = NodePlan(free, [], [over, later])
    assert node.earliest(req, NOW, 50.0) == NOW  # ends as the hold starts
    assert node.earliest(req, NOW, 51.0) == NOW + 80  # would overlap it: after its end
    forever = NodePlan(free, [], [Hold(NOW + 50, INF, 1, 1, 10)])
    assert forever.earliest(req, NOW, 51.0) == INF
    assert math.isinf(forever.earliest(req, NOW, INF))


class _Forgetful(dict):  # type: ignore[type-arg]
    """A planner's profiles that keeps none: each node builds its own, every time."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


class _Unkept(Planner):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._profiles._by_state = _Forgetful()


@settings(max_examples=40, deadline=None)
@given(
    running=st.lists(st.tuples(st.sampled_from([2, 4, 6]), st.integers(1, 8)), min_size=3, max_size=8),
    pending=st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4, 8]), st.integers(1, 12)),
        min_size=3,
        max_size=14,
    ),
)
def test_conservative_plans_the_same_with_profiles_kept_by_node_state(
    running: list[tuple[int, int]], pending: list[tuple[int, int, int]]
) -> None:
    """Conservative backfill's reservations read each held node state's ``Profile``, built once per state and
    cycle: a plan equals the one where every node builds its own each time (nodes in different states but
    alike in part, the same free GPUs with other releases or holds, must not share one)."""
    log = Log(*cluster(nodes=8, gpus=8))
    for i, (gpus, hours) in enumerate(running, start=1):
        log.add(submitted(i, job(gpus=gpus, nodes=1, time_s=hours * 600)))
        log.add(allocated(i, {f"gpu{i:02d}": list(range(gpus))}, time_s=hours * 600))
    first = len(running) + 1
    for k, (nodes, gpus, hours) in enumerate(pending, start=first):
        log.add(submitted(k, job(gpus=gpus, nodes=nodes, time_s=hours * 600)), step=0.0)
    pol = dataclasses.replace(policy(), backfill="conservative")
    kept = plan(log.state, log.state.now, pol)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plan_module, "Planner", _Unkept)
        unkept = plan(log.state, log.state.now, pol)
    assert kept.decisions == unkept.decisions
    assert kept.starts == unkept.starts
    assert kept.reasons == unkept.reasons
