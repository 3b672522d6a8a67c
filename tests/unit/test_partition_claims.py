"""Which accounting process projects which partition (``libs/core/partition_claims.py``): a process keeps
its preferred partition, takes one whose holder died when nobody who prefers it is alive, and hands it back
when that process beats again. Times are monotonic seconds from 0; the TTL is 3 s; two partitions."""

from __future__ import annotations

import pytest

from corral.libs.core import partition_claims as pc
from corral.libs.core.lease import Lease, Seen
from corral.libs.core.partition_claims import Claim, Presence

TTL = 3.0
P = 2


def held(token: str, epoch: int = 1, released: bool = False) -> Lease:
    return Lease(holder=f"acct-{token}", token=token, epoch=epoch, ttl_s=TTL, released=released)


def key(value: Lease | None, revision: int = 5, since: float = 0.0) -> Seen:
    return Seen(revision=0 if value is None else revision, lease=value, since=since)


CASES = [
    # (id, now, key of partition, partition, my replica, my renewed_at, live replicas, expected)
    ("own-missing-take", 0.0, key(None), 0, 0, None, {0}, Claim("take", 1)),
    ("own-held-by-me-renew-when-due", 1.0, key(held("r0")), 0, 0, 0.0, {0, 1}, Claim("renew", 1)),
    ("own-held-by-another-fresh-wait", 2.0, key(held("r1")), 0, 0, None, {0, 1}, Claim("wait")),
    ("own-held-by-another-lapsed-take", 3.0, key(held("r1")), 0, 0, None, {0, 1}, Claim("take", 2)),
    ("other-preferrer-dead-lapsed-take", 3.0, key(held("r1")), 1, 0, None, {0}, Claim("take", 2)),
    ("other-preferrer-dead-fresh-wait", 1.0, key(held("r1")), 1, 0, None, {0}, Claim("wait")),
    ("other-released-take", 0.1, key(held("r1", released=True)), 1, 0, None, {0}, Claim("take", 2)),
    ("other-held-by-me-preferrer-dead-renew", 1.5, key(held("r0")), 1, 0, 0.0, {0}, Claim("renew", 1)),
    ("other-held-by-me-preferrer-back-release", 0.5, key(held("r0")), 1, 0, 0.0, {0, 1}, Claim("release")),
    ("other-lapsed-but-preferrer-alive-wait", 9.0, key(held("r1")), 1, 0, None, {0, 1}, Claim("wait")),
    ("other-missing-but-preferrer-alive-wait", 0.0, key(None), 1, 0, None, {0, 1}, Claim("wait")),
    ("other-mine-by-key-but-lost-wait", 0.5, key(held("r0")), 1, 0, None, {0, 1}, Claim("wait")),
    # Three replicas, two partitions: replicas 0 and 2 both prefer partition 0: holder and standby.
    ("shared-preference-is-a-plain-lease", 1.0, key(held("r2")), 0, 0, None, {0, 1, 2}, Claim("wait")),
]


@pytest.mark.parametrize(
    ("now", "seen", "partition", "replica", "renewed_at", "live", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_claim(
    now: float,
    seen: Seen,
    partition: int,
    replica: int,
    renewed_at: float | None,
    live: set[int],
    expected: Claim,
) -> None:
    claim = pc.claim(
        now,
        seen,
        f"r{replica}",
        renewed_at,
        TTL,
        partition=partition,
        partitions=P,
        replica=replica,
        live=frozenset(live),
    )
    assert claim == expected


def test_one_survivor_claims_every_partition_and_two_share_them_again() -> None:
    """The rule, run for two replicas over the partitions' keys: each keeps its own; when replica 1 dies
    (no beat, no renewal) replica 0 takes partition 1 a TTL later; when replica 1 beats again, replica 0
    hands partition 1 back and replica 1 takes it."""
    keys = {0: key(held("r0")), 1: key(held("r1"))}
    renewed = {(0, 0): 0.0, (1, 1): 0.0}

    def step(now: float, replica: int, live: set[int]) -> None:
        for k in (0, 1):
            claim = pc.claim(
                now,
                keys[k],
                f"r{replica}",
                renewed.get((replica, k)),
                TTL,
                partition=k,
                partitions=P,
                replica=replica,
                live=frozenset(live),
            )
            if claim.action in ("take", "renew"):
                keys[k] = key(held(f"r{replica}", claim.epoch), revision=keys[k].revision + 1, since=now)
                renewed[(replica, k)] = now
            elif claim.action == "release":
                keys[k] = key(held(f"r{replica}", released=True), revision=keys[k].revision + 1, since=now)
                renewed.pop((replica, k))

    def holders() -> dict[int, str]:
        return {k: seen.lease.token for k, seen in keys.items() if seen.lease and not seen.lease.released}

    step(1.0, 0, {0, 1})
    step(1.0, 1, {0, 1})
    assert holders() == {0: "r0", 1: "r1"}
    for now in (2.0, 3.0, 4.0, 5.0):  # replica 1 is dead: only replica 0 runs the rule
        step(now, 0, {0})
    assert holders() == {0: "r0", 1: "r0"}
    step(6.0, 0, {0, 1})  # replica 1 beats again
    assert holders() == {0: "r0"}
    step(6.1, 1, {0, 1})
    assert holders() == {0: "r0", 1: "r1"}


@pytest.mark.parametrize(
    ("k", "partitions", "name"),
    [(0, 1, "accounting"), (0, 2, "accounting-p0of2"), (2, 3, "accounting-p2of3")],
    ids=["one-partition-keeps-the-old-name", "first-of-two", "last-of-three"],
)
def test_partition_names(k: int, partitions: int, name: str) -> None:
    assert pc.partition_name(k, partitions) == pc.partition_key(k, partitions) == name


def test_preferred_partition_and_liveness() -> None:
    assert [pc.preferred(r, 2) for r in range(4)] == [0, 1, 0, 1]
    presences = [
        Presence(replica=0, name="a", token="t0", beat_at=100.0, ttl_s=TTL),
        Presence(replica=1, name="b", token="t1", beat_at=96.0, ttl_s=TTL),  # three beats missed
    ]
    assert pc.alive(101.0, presences) == frozenset({0})
    assert pc.presence_key(1) == "accounting.replica.1"
