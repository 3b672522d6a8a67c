"""The lease rules (``libs/core/lease.py``): who leads, when to renew, when a standby takes over, and the
lines of ``scontrol ping``. Times are monotonic seconds from 0; the TTL is 3 s."""

from __future__ import annotations

import pytest

from corral.libs.core import lease
from corral.libs.core.lease import Lease, Member, Seen, Step

TTL = 3.0


def held(token: str = "a", epoch: int = 4, **fields: object) -> Lease:
    return Lease(holder=f"host-{token}", token=token, epoch=epoch, ttl_s=TTL, **fields)  # type: ignore[arg-type]


def key(value: Lease | None, revision: int = 7, since: float = 0.0) -> Seen:
    return Seen(revision=revision, lease=value, since=since)


CASES = [
    # (id, now, key, my token, my renewed_at, floor epoch, expected step)
    ("no-key-take-epoch-1", 0.0, key(None, revision=0), "b", None, 0, Step("take", 1)),
    ("no-key-bumps-past-the-log", 0.0, key(None, revision=0), "b", None, 9, Step("take", 10)),
    ("undecodable-value-take", 0.0, key(None), "b", None, 0, Step("take", 1)),
    ("released-take-at-once", 0.1, key(held(released=True)), "b", None, 0, Step("take", 5)),
    ("others-fresh-wait", 2.9, key(held()), "b", None, 0, Step("wait")),
    ("others-unchanged-for-ttl-take", 3.0, key(held()), "b", None, 0, Step("take", 5)),
    ("take-bumps-past-the-log", 3.0, key(held()), "b", None, 8, Step("take", 9)),
    ("mine-fresh-wait", 0.5, key(held()), "a", 0.0, 0, Step("wait")),
    ("mine-due-renew", 1.0, key(held()), "a", 0.0, 0, Step("renew", 4)),
    ("mine-after-a-pause-try-renewing", 60.0, key(held()), "a", 0.0, 0, Step("renew", 4)),
]


@pytest.mark.parametrize(
    ("now", "seen", "token", "renewed_at", "floor", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_next_step(
    now: float, seen: Seen, token: str, renewed_at: float | None, floor: int, expected: Step
) -> None:
    assert lease.next_step(now, seen, token, renewed_at, TTL, floor) == expected


def test_a_lapse_is_timed_from_the_first_sighting_of_a_revision() -> None:
    first = lease.seen(None, 7, held(), now=10.0)
    again = lease.seen(first, 7, held(), now=12.0)
    assert again.since == 10.0
    renewed = lease.seen(again, 8, held(), now=12.5)  # the holder renewed: the clock starts again
    assert renewed.since == 12.5
    assert lease.next_step(13.0, again, "b", None, TTL, 0) == Step("take", 5)
    assert lease.next_step(13.0, renewed, "b", None, TTL, 0) == Step("wait")


def test_a_holder_stops_leading_before_any_standby_may_take_over() -> None:
    # The holder sent its renewal at 5.0; a standby cannot see the new revision before that.
    sent, sighted = 5.0, 5.0
    for now in (5.0, 7.9, 7.99):
        assert lease.leading(now, sent, TTL)
        assert lease.next_step(now, key(held(), since=sighted), "b", None, TTL, 0).action == "wait"
    assert not lease.leading(sent + TTL, sent, TTL)
    assert lease.next_step(sighted + TTL, key(held(), since=sighted), "b", None, TTL, 0).action == "take"
    assert not lease.leading(0.0, None, TTL)


def test_the_default_ttl_meets_the_failover_target() -> None:
    # Worst case: the leader dies right after a renewal; a standby sees it one poll late, takes it one
    # poll after the TTL, and decides in its next cycle.
    assert lease.DEFAULT_TTL_S + 2 * lease.poll_s(lease.DEFAULT_TTL_S) < 5.0
    assert lease.poll_s(1.2) == pytest.approx(0.1)


def member(name: str, token: str, beat_at: float) -> Member:
    return Member(name=name, token=token, beat_at=beat_at, ttl_s=TTL)


ROSTER_CASES = [
    (
        "leader-and-one-backup",
        held("a"),
        [member("host-b", "b", 99.0), member("host-a", "a", 99.0)],
        [("host-a", "primary", True), ("host-b", "backup", True)],
    ),
    (
        "two-backups-one-silent",
        held("a"),
        [member("host-a", "a", 99.0), member("host-c", "c", 90.0), member("host-b", "b", 99.0)],
        [("host-a", "primary", True), ("host-b", "backup1", True), ("host-c", "backup2", False)],
    ),
    ("dead-leader", held("a"), [member("host-a", "a", 80.0)], [("host-a", "primary", False)]),
    (
        "three-beats-missed-is-down",
        held("a"),
        [member("host-a", "a", 97.5), member("host-b", "b", 96.5)],
        [("host-a", "primary", True), ("host-b", "backup", False)],
    ),
    ("released", held("a", released=True), [member("host-a", "a", 99.0)], [("host-a", "backup", True)]),
    ("no-lease", None, [], []),
]


@pytest.mark.parametrize(
    ("value", "members", "lines"), [c[1:] for c in ROSTER_CASES], ids=[c[0] for c in ROSTER_CASES]
)
def test_roster(value: Lease | None, members: list[Member], lines: list[tuple[str, str, bool]]) -> None:
    assert lease.roster(100.0, value, members) == lines
