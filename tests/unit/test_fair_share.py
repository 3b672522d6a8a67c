"""Fair share: TRES billing, half-life decay, classic 2^(-U/S), Fair Tree ranks, determinism."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.libs.core.fair_share import (
    ROOT,
    Account,
    AccountTree,
    TreeError,
    TresWeights,
    Usage,
    UserAssoc,
    billing,
    build_tree,
    charge,
    decayed,
)
from corral.libs.core.share_factors import classic_factors, fair_tree_factors, level_fairshare, to_float

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
HL = 100.0  # half-life of the tables, seconds


def accounts(spec: str) -> list[Account]:
    """Accounts written ``name:shares`` or ``name:shares<parent``, space-separated."""
    out = []
    for item in spec.split():
        name, _, rest = item.partition(":")
        shares, _, parent = rest.partition("<")
        out.append(Account(name, parent or ROOT, int(shares)))
    return out


def assocs(spec: str) -> list[UserAssoc]:
    """User associations written ``user@account`` or ``user@account:shares``, space-separated."""
    out = []
    for item in spec.split():
        user, _, rest = item.partition("@")
        account, _, shares = rest.partition(":")
        out.append(UserAssoc(user, account, int(shares or 1)))
    return out


def tree(accts: str, users: str) -> AccountTree:
    """A tree from the two compact specs above."""
    return build_tree(accounts(accts), assocs(users))


def usage(amounts: dict[str, float], at: float = T0) -> Usage:
    """Usage with each association key charged its amount at ``at``."""
    out = Usage()
    for key, amount in amounts.items():
        charge(out, key, amount, at, HL)
    return out


@pytest.mark.parametrize(
    ("gpus", "cpus", "mem_mb", "seconds", "weights", "expected"),
    [
        (8, 16, 0, 3600, TresWeights(), (16 + 8 * 10) * 3600),
        (0, 4, 0, 10, TresWeights(), 40),
        (8, 96, 0, 3600, TresWeights(cpu=0, gpu=1), 8 * 3600),
        (0, 0, 4096, 10, TresWeights(cpu=0, gpu=0, mem_per_gb=0.25), 10),
        (1, 1, 1024, 2, TresWeights(cpu=2, gpu=3, mem_per_gb=4), (2 + 3 + 4) * 2),
        (8, 16, 0, -5, TresWeights(), 0),
    ],
    ids=["default-gpu-10", "cpu-only", "gpu-seconds", "memory-per-gib", "all-three", "negative-time"],
)
def test_billing_sums_weighted_tres(
    gpus: int, cpus: int, mem_mb: int, seconds: float, weights: TresWeights, expected: float
) -> None:
    assert billing(gpus, cpus, mem_mb, seconds, weights) == expected


@pytest.mark.parametrize(
    ("charges", "read_at", "half_life", "expected"),
    [
        ([(0, 100)], 0, HL, 100),
        ([(0, 100)], 100, HL, 50),
        ([(0, 100)], 300, HL, 12.5),
        ([(0, 100)], 300, 0, 100),
        ([(0, 100), (100, 100)], 100, HL, 150),
        ([(0, 100), (100, 100)], 200, HL, 75),
        ([(100, 100), (0, 100)], 100, HL, 200),
        ([(100, 100), (0, 100)], 200, HL, 100),
        ([], 100, HL, 0),
    ],
    ids=[
        "now",
        "one-half-life",
        "three-half-lives",
        "no-decay",
        "decay-then-add",
        "decay-the-sum",
        "late-charge-not-decayed",
        "late-charge-keeps-time",
        "never-charged",
    ],
)
def test_usage_halves_every_half_life(
    charges: list[tuple[float, float]], read_at: float, half_life: float, expected: float
) -> None:
    u = Usage()
    for dt, amount in charges:
        charge(u, "A/alice", amount, T0 + dt, half_life)
    assert decayed(u, "A/alice", T0 + read_at, half_life) == expected


@pytest.mark.parametrize("amount", [-1.0, math.nan, math.inf], ids=["negative", "nan", "inf"])
def test_charge_rejects_amounts_that_are_not_usage(amount: float) -> None:
    with pytest.raises(ValueError, match="A/alice"):
        charge(Usage(), "A/alice", amount, T0, HL)


def test_users_without_an_association_get_their_own_account() -> None:
    t = build_tree(accounts("ml:1"), assocs("carol@ml"), users=["alice", "carol", "alice"])
    assert t.users == ["alice/alice", "ml/carol"]
    assert (t.parent["alice"], t.parent["alice/alice"], t.shares["alice"], t.shares["alice/alice"]) == (
        ROOT,
        "alice",
        1,
        1,
    )


@pytest.mark.parametrize(
    ("accts", "users", "culprit"),
    [
        ("A:1<Z", "", "'A'"),
        ("A:1<B B:1<A", "", "cycle"),
        ("A:1 A:2", "", "'A'"),
        ("A:0", "", "'A'"),
        ("A/B:1", "", "'A/B'"),
        ("A:1", "x@B", "'B/x'"),
        ("A:1", "x@A:1 x@A:2", "'A/x'"),
    ],
    ids=["unknown-parent", "cycle", "twice", "no-shares", "slash", "unknown-account", "association-twice"],
)
def test_build_tree_rejects_what_is_not_a_tree(accts: str, users: str, culprit: str) -> None:
    with pytest.raises(TreeError, match=culprit):
        tree(accts, users)


def test_only_root_has_no_parent() -> None:
    with pytest.raises(TreeError, match="'B'"):
        build_tree([Account("B", None, 1)], [])


# The example of https://slurm.schedmd.com/classic_fair_share.html, figure 3: usage is given as
# fractions of the machine (summing to 0.7), so 0.3 goes to a key no longer in the tree.
SLURM_EXAMPLE = tree("A:40 D:60 B:30<A C:10<A E:25<D F:35<D", "u1@B u2@C u3@C u4@E u5@F")
SLURM_USAGE = {"B/u1": 0.2, "C/u2": 0.25, "E/u4": 0.25, "retired/u0": 0.3}


@pytest.mark.parametrize(
    ("key", "expected"),
    [("B/u1", 0.408479), ("C/u2", 0.022097), ("C/u3", 0.125), ("E/u4", 0.5), ("F/u5", 0.749154)],
    ids=["user1", "user2", "user3", "user4", "user5"],
)
def test_classic_reproduces_slurms_worked_example(key: str, expected: float) -> None:
    factors = classic_factors(SLURM_EXAMPLE, usage(SLURM_USAGE), T0, HL)
    assert factors[key] == pytest.approx(expected, abs=1e-6)


def test_classic_is_two_to_the_minus_usage_over_shares() -> None:
    t = tree("A:1 B:1", "u@A v@B")
    factors = classic_factors(t, usage({"A/u": 1.0, "B/v": 3.0}), T0 + 5 * HL, HL)
    assert factors == {"A/u": pytest.approx(2**-0.5), "B/v": pytest.approx(2**-1.5)}
    assert classic_factors(t, Usage(), T0, HL) == {"A/u": 1.0, "B/v": 1.0}


TWO_ACCOUNTS = tree("A:60 B:40", "a1@A a2@A b1@B b2@B")


@pytest.mark.parametrize(
    ("t", "amounts", "expected"),
    [
        (
            TWO_ACCOUNTS,
            {"A/a2": 100, "B/b1": 50, "B/b2": 10},
            {"B/b2": 1.0, "B/b1": 0.75, "A/a1": 0.5, "A/a2": 0.25},
        ),
        (TWO_ACCOUNTS, {}, {"A/a1": 1.0, "A/a2": 1.0, "B/b1": 1.0, "B/b2": 1.0}),
        (tree("A:1", "a@A b@A"), {"A/b": 5}, {"A/a": 1.0, "A/b": 0.5}),
        (
            tree("A:1", "u1@A u2@A u3@A"),
            {"A/u1": 10, "A/u2": 10, "A/u3": 30},
            {"A/u1": 1.0, "A/u2": 1.0, "A/u3": 1 / 3},
        ),
        (
            tree("A:1", "x@A y@A alice@root"),
            {"A/y": 10, "root/alice": 10},
            {"A/x": 1.0, "A/y": 2 / 3, "root/alice": 1.0},
        ),
        (
            tree("A:1 B:1", "a1@A a2@A b1@B"),
            {"A/a2": 10, "B/b1": 10},
            {"A/a1": 1.0, "B/b1": 2 / 3, "A/a2": 1 / 3},
        ),
    ],
    ids=[
        "over-used-account-ranks-all-its-users-last",
        "no-usage-all-tie-at-one",
        "unused-user-outranks-used-sibling",
        "tied-users-share-a-rank",
        "user-tied-with-account-gets-its-top-rank",
        "tied-accounts-merge-children",
    ],
)
def test_fair_tree_ranks(t: AccountTree, amounts: dict[str, float], expected: dict[str, float]) -> None:
    assert fair_tree_factors(t, usage(amounts), T0, HL) == pytest.approx(expected)


def test_level_fairshare_is_shares_over_usage_among_siblings() -> None:
    lfs = level_fairshare(TWO_ACCOUNTS, usage({"A/a2": 100, "B/b1": 50, "B/b2": 10}), T0, HL)
    assert lfs == {
        "A": pytest.approx(0.6 / (100 / 160)),
        "B": pytest.approx(0.4 / (60 / 160)),
        "A/a1": math.inf,
        "A/a2": pytest.approx(0.5),
        "B/b1": pytest.approx(0.5 / (50 / 60)),
        "B/b2": pytest.approx(0.5 / (10 / 60)),
    }


def test_same_inputs_in_any_order_give_the_same_tree_and_factors() -> None:
    # 0.1 + 0.2 + 0.3 in floats depends on the order of the additions; the factors must not.
    accts, users = accounts("A:1 B:1 C:2<B"), assocs("x@A y@B z@C w@C")
    amounts = {"A/x": 0.6, "B/y": 0.1, "C/z": 0.2, "C/w": 0.3}
    trees = {msgspec.json.encode(build_tree(a, u)) for a, u in [(accts, users), (accts[::-1], users[::-1])]}
    assert len(trees) == 1
    results = set()
    for order in itertools.permutations(amounts):
        u = usage({key: amounts[key] for key in order})
        for algorithm in (fair_tree_factors, classic_factors):
            results.add(
                (algorithm.__name__, tuple(sorted(algorithm(build_tree(accts, users), u, T0, HL).items())))
            )
    assert len(results) == 2


def test_tree_and_usage_survive_encoding() -> None:
    u = usage({"A/a2": 100.5, "B/b1": 3.25})
    assert msgspec.json.decode(msgspec.json.encode(u), type=Usage) == u
    assert msgspec.json.decode(msgspec.json.encode(TWO_ACCOUNTS), type=AccountTree) == TWO_ACCOUNTS


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[AccountTree, Usage, float, float]:
    """A random tree, usage charged over time, the time to read it and a half-life."""
    accts: list[Account] = []
    for i in range(draw(st.integers(1, 4))):
        parent = draw(st.sampled_from([ROOT] + [a.name for a in accts]))
        accts.append(Account(f"a{i}", parent, draw(st.integers(1, 5))))
    users = [
        UserAssoc(f"u{i}", draw(st.sampled_from(accts)).name, draw(st.integers(1, 3)))
        for i in range(draw(st.integers(1, 6)))
    ]
    t = build_tree(accts, users)
    half_life = draw(st.sampled_from([0.0, 3600.0, 7 * 86400.0]))
    u, now = Usage(), T0
    for _ in range(draw(st.integers(0, 10))):
        now += draw(st.floats(0, 1e6))
        charge(u, draw(st.sampled_from(t.users)), draw(st.floats(0, 1e9)), now, half_life)
    return t, u, now, half_life


ALGORITHMS = [fair_tree_factors, classic_factors]


@settings(max_examples=200, deadline=None)
@given(scenarios(), st.data())
def test_factors_are_in_unit_range_and_more_usage_never_helps(
    scenario: tuple[AccountTree, Usage, float, float], data: st.DataObject
) -> None:
    t, u, now, half_life = scenario
    before = {f.__name__: f(t, u, now, half_life) for f in ALGORITHMS}
    key = data.draw(st.sampled_from(t.users))
    charge(u, key, data.draw(st.floats(1e-9, 1e9)), now, half_life)
    for f in ALGORITHMS:
        after = f(t, u, now, half_life)
        assert set(after) == set(t.users)
        assert all(0.0 <= v <= 1.0 for v in [*before[f.__name__].values(), *after.values()])
        assert after[key] <= before[f.__name__][key], f.__name__


# The factors as they were computed before the exact sums became integer additions and a cycle asked for
# the pending jobs' associations only: each node's usage a sum of ``Fraction``s, every node's Level FS, every
# user ranked. The oracle the faster code must match exactly, float for float.
def reference_usage(tree: AccountTree, u: Usage, at: float, half_life: float) -> dict[str, Fraction]:
    out: dict[str, Fraction] = {}

    def visit(key: str) -> Fraction:
        kids = tree.children.get(key)
        own = Fraction(decayed(u, key, at, half_life)) if kids is None else sum(map(visit, kids), Fraction())
        out[key] = own
        return own

    visit(ROOT)
    return out


def reference_shares(tree: AccountTree) -> dict[str, Fraction]:
    level = {acc: sum(tree.shares[k] for k in kids) for acc, kids in tree.children.items()}
    return {key: Fraction(tree.shares[key], level[parent]) for key, parent in tree.parent.items()}


def reference_fair_tree(tree: AccountTree, u: Usage, at: float, half_life: float) -> dict[str, float]:
    used = reference_usage(tree, u, at, half_life)
    lfs = {
        key: None if used[key] == 0 else share * used[tree.parent[key]] / used[key]
        for key, share in reference_shares(tree).items()
    }
    n, factors = len(tree.users), {}

    def order(key: str) -> tuple[bool, Fraction]:
        lf = lfs[key]
        return (lf is not None, -lf if lf is not None else Fraction())

    def descend(siblings: list[str]) -> None:
        for _, group in itertools.groupby(sorted(siblings, key=lambda k: (order(k), k)), key=order):
            tied = list(group)
            rank = n - len(factors)
            merged = [kid for key in tied for kid in tree.children.get(key, [])]
            if merged:
                descend(merged)
            factors.update({key: rank / n for key in tied if key not in tree.children})

    descend(tree.children[ROOT])
    return {key: factors[key] for key in tree.users}


def reference_classic(tree: AccountTree, u: Usage, at: float, half_life: float) -> dict[str, float]:
    used = reference_usage(tree, u, at, half_life)
    total = sum((Fraction(decayed(u, k, at, half_life)) for k in u.by_key), Fraction())
    shares = reference_shares(tree)
    norm: dict[str, Fraction] = {ROOT: Fraction(1)}
    effective: dict[str, Fraction] = {}
    factors: dict[str, float] = {}
    todo = list(tree.children[ROOT])
    while todo:
        key = todo.pop()
        parent, share = tree.parent[key], shares[key]
        norm[key] = norm[parent] * share
        actual = used[key] / total if total else Fraction()
        effective[key] = actual if parent == ROOT else actual + (effective[parent] - actual) * share
        if key in tree.children:
            todo.extend(tree.children[key])
        else:
            factors[key] = math.pow(2.0, -to_float(effective[key] / norm[key]))
    return {key: factors[key] for key in tree.users}


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.data())
def test_factors_equal_the_plain_fraction_computation_and_a_cycle_asks_only_for_its_users(
    scenario: tuple[AccountTree, Usage, float, float], data: st.DataObject
) -> None:
    t, u, now, half_life = scenario
    if data.draw(
        st.booleans()
    ):  # usage of an association no longer in the tree still counts in classic's total
        charge(u, "gone/user", data.draw(st.floats(0, 1e9)), now, half_life)
    for fast, reference in ((fair_tree_factors, reference_fair_tree), (classic_factors, reference_classic)):
        every = fast(t, u, now, half_life)
        assert every == reference(t, u, now, half_life), fast.__name__
        assert list(every) == t.users
        wanted = data.draw(st.sets(st.sampled_from([*t.users, "nobody/x", "a0"])))
        assert fast(t, u, now, half_life, wanted) == {k: every[k] for k in sorted(wanted) if k in every}
    lfs = level_fairshare(t, u, now, half_life)
    used = reference_usage(t, u, now, half_life)
    assert lfs == {
        key: math.inf if used[key] == 0 else to_float(share * used[t.parent[key]] / used[key])
        for key, share in reference_shares(t).items()
    }
