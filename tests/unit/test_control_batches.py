"""Commands that name more jobs than one control request may carry (``scancel -u`` of a sweep's user with
tens of thousands of jobs) send them in batches, each within the API's bound (``MAX_CANCEL``): one request of
12,000 jobs was refused as malformed and scancel cancelled nothing."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.cli import scancel
from corral.cli.jobrefs import CONTROL_BATCH, JobRef, batches, split_refs
from corral.schemas import api
from corral.schemas.api_requests import MAX_CANCEL

pytestmark = pytest.mark.unit


def named(refs: list[JobRef]) -> list[tuple[int, int | None]]:
    """Every job ``refs`` name, in order: (id, None) or (array id, task index)."""
    return [(r.job_id, t) for r in refs for t in (r.tasks if r.tasks is not None else (None,))]


def jobs_of(refs: list[JobRef]) -> int:
    return sum(1 if r.tasks is None else len(r.tasks) for r in refs)


def test_a_users_thirty_thousand_jobs_go_in_requests_the_gateway_accepts() -> None:
    refs = [JobRef(job_id) for job_id in range(1, 30_001)] + [JobRef(40_000, tuple(range(1001)))]
    runs = batches(refs)
    assert len(runs) == -(-jobs_of(refs) // CONTROL_BATCH)
    for run in runs:
        request = scancel.cancel_request(run)
        # As the gateway's server decodes it: within the schema's bounds.
        decoded = msgspec.json.decode(msgspec.json.encode(request), type=api.CancelRequest)
        assert len(decoded.job_ids) + sum(len(t.task_ids) for t in decoded.tasks) <= CONTROL_BATCH
    assert CONTROL_BATCH <= MAX_CANCEL
    assert [job for run in runs for job in named(run)] == [job for ref in refs for job in named([ref])]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.builds(JobRef, st.integers(1, 10**6)),
            st.builds(
                JobRef,
                st.integers(1, 10**6),
                st.lists(st.integers(0, 1000), min_size=1, max_size=12).map(tuple),
            ),
        ),
        max_size=40,
    ),
    st.integers(1, 9),
)
def test_batches_keep_every_job_in_order_and_fill_each_but_the_last(refs: list[JobRef], size: int) -> None:
    runs = batches(refs, size)
    assert [job for run in runs for job in named(run)] == [job for ref in refs for job in named([ref])]
    assert all(1 <= jobs_of(run) <= size for run in runs)
    assert all(jobs_of(run) == size for run in runs[:-1])
    for run in runs:
        ids, tasks = split_refs(run)
        assert len(ids) + sum(len(t.task_ids) for t in tasks) <= size
