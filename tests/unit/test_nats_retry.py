"""The commands' retry policy (``libs/runtime/nats_retry.py``): which errors, how often, for how long."""

from __future__ import annotations

import pytest

from corral.libs.runtime.nats_errors import (
    NatsConnectError,
    NatsRequestError,
    NoResponders,
    PermissionDenied,
    RequestTimeout,
    ServerUnreachable,
)
from corral.libs.runtime.nats_retry import delays, retryable, retrying

pytestmark = pytest.mark.unit

URL = "nats://127.0.0.1:4222"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ServerUnreachable(URL, "[Errno 111] Connection refused"), True),
        (NoResponders("corral.api.v1.submit.alice"), True),
        (NatsConnectError(URL, "Authorization Violation"), False),
        (RequestTimeout("corral.api.v1.submit.alice", 15.0), False),
        (NatsRequestError(f"lost the connection to {URL}: reset"), False),
        (PermissionDenied("Permissions Violation for Publish"), False),
    ],
    ids=["refused", "no-responders", "auth-refused", "timeout", "lost-after-sending", "permission"],
)
def test_only_errors_that_reached_no_service_are_retried(error: Exception, expected: bool) -> None:
    assert retryable(error) is expected


def test_delays_double_from_a_tenth_to_one_second_and_end_at_the_budget() -> None:
    assert list(delays(4.0)) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 0.5])
    assert sum(delays(10.0)) == pytest.approx(10.0)
    assert list(delays(0.0)) == []


class Flaky:
    """Fails with ``error`` the first ``failures`` times, then returns "ok"."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_a_refused_connection_is_tried_again_until_it_is_accepted() -> None:
    slept: list[float] = []
    attempt = Flaky(3, ServerUnreachable(URL, "refused"))
    assert retrying(attempt, budget=10.0, sleep=slept.append) == "ok"
    assert attempt.calls == 4
    assert slept == pytest.approx([0.1, 0.2, 0.4])


def test_the_last_error_is_raised_once_the_budget_is_spent() -> None:
    slept: list[float] = []
    attempt = Flaky(100, NoResponders("corral.api.v1.jobs.alice"))
    with pytest.raises(NoResponders):
        retrying(attempt, budget=2.0, sleep=slept.append)
    assert sum(slept) == pytest.approx(2.0)
    assert attempt.calls == len(slept) + 1 == 6  # 0.1 0.2 0.4 0.8 0.5


def test_a_timeout_is_not_retried() -> None:
    slept: list[float] = []
    attempt = Flaky(1, RequestTimeout("corral.api.v1.cancel.alice", 15.0))
    with pytest.raises(RequestTimeout):
        retrying(attempt, budget=10.0, sleep=slept.append)
    assert attempt.calls == 1 and slept == []
