"""Fair share (the fair-share factor of Slurm's priority/multifactor), pure.

**Tree.** Accounts form a tree under ``root``; users hang off accounts as leaves ("user
associations", key ``account/user``). Every node has raw shares; a node's share of its parent is
its shares over the shares of its siblings (itself included).

**Usage** is billed in TRES-seconds (`billing`, Slurm's TRESBillingWeights summed, i.e. without
PriorityFlags=MAX_TRES) and decays exponentially with a half-life:
``v(t) = v(t0) * 0.5 ** ((t - t0) / half_life)``. It is stored only per user association, with the
time it was last decayed, and decayed lazily (when charged or read); an account's usage is the sum
of the associations beneath it, computed when needed, so a charge touches one entry.

**Factors** (each in [0, 1], higher = more deserving):

- `fair_tree_factors` (Slurm's default, https://slurm.schedmd.com/fair_tree.html): siblings are
  ranked by Level Fairshare ``LF = S / U`` (S = shares over the siblings' shares, U = usage over the
  siblings' usage; no usage = infinite LF); a depth-first walk, higher LF first, ranks the users
  from ``n`` (the number of user associations) down, and a user's factor is ``rank / n``, so the
  top user has 1.0. Ties, as documented: sibling users with equal LF share a rank; a user tied with
  a sibling account gets the rank of that account's highest ranked user; tied sibling accounts have
  their children merged before descending. The rank after a tie skips the tied positions
  (``rank--`` runs once per user), so n users always span n positions.
- `classic_factors` (PriorityFlags=NO_FAIR_TREE, https://slurm.schedmd.com/classic_fair_share.html):
  ``2 ** (-U_E / S)`` with S the product of the share fractions along the path and U_E the
  effective usage ``U_E = U + (U_E(parent) - U) * S_child / S_siblings`` (U_E = U right under root),
  U being the node's usage over the total usage of every key charged (so usage of associations
  since removed from the tree still counts in the total). No usage at all: U = 0, factor 1.

**Exactness.** Sums, ratios and comparisons are exact on the stored floats: the result does not depend
on dict order (float sums would), ties are exact, and more usage can never round into a better factor.
Results are converted to float once, at the end. Every float is a dyadic rational ``num / 2 ** k``, so a
node's usage is summed as integers (``_exact_sums``), Fair Tree compares Level FS by cross-multiplying
integers, and classic's ratios run on `fractions.Fraction`.

**Cost.** A scheduling cycle asks for the factors of its pending jobs' associations only (``wanted``): Fair
Tree ranks the levels above them and counts the users of the subtrees without one; classic walks the
accounts above each. The usage sums still visit the whole tree once a cycle. What depends on the tree alone
(its order, leaf counts, share fractions) is kept per tree (``_shape``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from fractions import Fraction
from functools import cmp_to_key
from typing import NamedTuple

import msgspec

#: The account at the top of every tree.
ROOT = "root"


class TreeError(ValueError):
    """The accounts and associations do not form a tree; the message names the culprit."""


class Account(msgspec.Struct, frozen=True):
    """An account (Slurm: an account association)."""

    name: str  # account name (no "/")
    parent: str | None = ROOT  # parent account; None only for root
    shares: int = 1  # raw shares (Slurm's Fairshare=), >= 1


class UserAssoc(msgspec.Struct, frozen=True):
    """A user's association with an account: a leaf of the tree."""

    user: str  # user name (no "/")
    account: str  # the account the user charges
    shares: int = 1  # raw shares among the account's children, >= 1


class AccountTree(msgspec.Struct, frozen=True):
    """The share tree, canonical: keys and children sorted, so equal trees encode identically."""

    parent: dict[str, str]  # every node but root -> its account
    shares: dict[str, int]  # every node -> raw shares (root: 1)
    children: dict[str, list[str]]  # every account (leaves have no entry) -> its children, sorted
    users: list[str]  # every user association key, sorted


def user_key(user: str, account: str) -> str:
    """The key of ``user``'s association with ``account`` (its node and its usage entry)."""
    return f"{account}/{user}"


def build_tree(
    accounts: Iterable[Account], associations: Iterable[UserAssoc], users: Iterable[str] = ()
) -> AccountTree:
    """The tree of ``accounts`` and ``associations``; root is implicit.

    Each of ``users`` without an association gets a default one like our default account
    (account = user): account ``<user>`` under root (made if missing) with shares 1, user shares 1.
    """
    accs = {ROOT: Account(ROOT, None, 1)}
    for acc in accounts:
        if acc.name in accs and acc != accs[acc.name]:
            raise TreeError(f"account {acc.name!r} defined twice")
        accs[acc.name] = acc
    assocs: dict[str, UserAssoc] = {}
    for assoc in associations:
        key = user_key(assoc.user, assoc.account)
        if key in assocs and assoc != assocs[key]:
            raise TreeError(f"association {key!r} defined twice")
        assocs[key] = assoc
    associated = {a.user for a in assocs.values()}
    for user in users:
        if user not in associated:
            accs.setdefault(user, Account(user, ROOT, 1))
            assocs[user_key(user, user)] = UserAssoc(user, user, 1)
    parent = {name: acc.parent for name, acc in accs.items() if acc.parent is not None}
    parent |= {key: a.account for key, a in assocs.items()}
    shares = {name: acc.shares for name, acc in accs.items()} | {k: a.shares for k, a in assocs.items()}
    for name, acc in accs.items():
        if "/" in name or (acc.parent is None) != (name == ROOT):
            raise TreeError(f"account {name!r}: names have no '/'; only root has no parent")
    for key, a in assocs.items():
        if "/" in a.user or a.account not in accs:
            raise TreeError(f"association {key!r}: user names have no '/'; the account must exist")
    for name, value in shares.items():
        if value < 1:
            raise TreeError(f"{name!r}: shares must be >= 1, not {value}")
    children: dict[str, list[str]] = {name: [] for name in sorted(accs)}
    for key in sorted(parent):
        if parent[key] not in children:
            raise TreeError(f"account {key!r}: parent {parent[key]!r} does not exist")
        children[parent[key]].append(key)
    if _reachable(children) != len(shares):
        raise TreeError("accounts form a cycle that does not reach root")
    return AccountTree(
        parent={k: parent[k] for k in sorted(parent)},
        shares={k: shares[k] for k in sorted(shares)},
        children=children,
        users=sorted(assocs),
    )


def _reachable(children: dict[str, list[str]]) -> int:
    """How many nodes hang (transitively) from root, root included."""
    seen, todo = 0, [ROOT]
    while todo:
        seen += 1
        todo.extend(children.get(todo.pop(), []))
    return seen


class TresWeights(msgspec.Struct, frozen=True):
    """What a second of each TRES costs (Slurm's TRESBillingWeights).

    Slurm bills CPUs only when unset; the GPU weight of 10 makes a GPU cost as much as ten CPUs.
    For usage in pure GPU-seconds set ``cpu=0, gpu=1``.
    """

    cpu: float = 1.0  # per allocated CPU
    gpu: float = 10.0  # per allocated GPU
    mem_per_gb: float = 0.0  # per GiB of allocated memory


def billing(gpus: int, cpus: int, mem_mb: int, seconds: float, weights: TresWeights) -> float:
    """TRES-seconds billed for an allocation held ``seconds``: the weighted sum of its TRES."""
    per_second = cpus * weights.cpu + gpus * weights.gpu + mem_mb / 1024 * weights.mem_per_gb
    return per_second * max(seconds, 0.0)


class Charged(msgspec.Struct, frozen=True, array_like=True):
    """One association's usage, as of the last time it was decayed."""

    value: float  # TRES-seconds, decayed to `at`
    at: float  # when `value` was last decayed (from the log's clock)


class Usage(msgspec.Struct):
    """Raw usage per user association key; insertion order is charge order (the log's order)."""

    by_key: dict[str, Charged] = {}  # association key -> its usage


def _decay(entry: Charged, at: float, half_life_s: float) -> float:
    """``entry`` decayed to ``at``; no decay with a half-life <= 0 (Slurm: decay disabled) or
    for a time before the entry's (the log's clock never goes back)."""
    if half_life_s <= 0 or at <= entry.at:
        return entry.value
    return entry.value * math.pow(0.5, (at - entry.at) / half_life_s)


def decayed(usage: Usage, key: str, at: float, half_life_s: float) -> float:
    """The usage of association ``key`` at ``at`` (0 if never charged)."""
    entry = usage.by_key.get(key)
    return 0.0 if entry is None else _decay(entry, at, half_life_s)


def charge(usage: Usage, key: str, amount: float, at: float, half_life_s: float) -> None:
    """Add ``amount`` TRES-seconds to ``key`` at ``at``, first decaying what it had to ``at``."""
    if not math.isfinite(amount) or amount < 0:
        raise ValueError(f"usage charged to {key!r} must be finite and >= 0, not {amount}")
    entry = usage.by_key.get(key)
    last = at if entry is None else max(entry.at, at)
    usage.by_key[key] = Charged(decayed(usage, key, at, half_life_s) + amount, last)


#: An exact sum of floats, ``num / 2 ** k``: every float is such a dyadic rational.
Dyadic = tuple[int, int]


def _dyadic(value: float) -> Dyadic:
    num, den = value.as_integer_ratio()
    return num, den.bit_length() - 1


def _add(a: Dyadic, b: Dyadic) -> Dyadic:
    (na, ka), (nb, kb) = a, b
    if ka >= kb:
        return na + (nb << (ka - kb)), ka
    return (na << (kb - ka)) + nb, kb


def exact_sums(tree: AccountTree, usage: Usage, at: float, half_life_s: float) -> dict[str, Dyadic]:
    """Every node's usage as an exact dyadic sum (``Fraction(num, 2 ** k)`` is its exact value): integer
    additions, where the same sums of ``Fraction``s cost a normalisation each (a site has thousands of
    associations, summed in every cycle)."""
    out: dict[str, Dyadic] = {}
    children, charged = tree.children, usage.by_key
    for key in reversed(_shape(tree).order):  # children before their account
        kids = children.get(key)
        if kids is None:
            entry = charged.get(key)
            if entry is None:
                out[key] = (0, 0)
            else:
                num, den = _decay(entry, at, half_life_s).as_integer_ratio()
                out[key] = (num, den.bit_length() - 1)
            continue
        parts = [out[kid] for kid in kids]
        top = max((k for _, k in parts), default=0)
        out[key] = (sum(num << (top - k) for num, k in parts), top)
    return out


def _depth_first(tree: AccountTree) -> list[str]:
    """Every node, root first, each account before its children."""
    order, todo = [], [ROOT]
    while todo:
        key = todo.pop()
        order.append(key)
        todo.extend(tree.children.get(key, ()))
    return order


def _shares_norm(tree: AccountTree) -> dict[str, Fraction]:
    """Every node's shares over its siblings' shares (itself included), root excluded."""
    level = {acc: sum(tree.shares[k] for k in kids) for acc, kids in tree.children.items()}
    return {key: Fraction(tree.shares[key], level[parent]) for key, parent in tree.parent.items()}


def level_fairshare(tree: AccountTree, usage: Usage, at: float, half_life_s: float) -> dict[str, float]:
    """Level FS of every node but root (``sshare -l``); ``math.inf`` for a node without usage."""
    sums = exact_sums(tree, usage, at, half_life_s)
    return {key: level_fs(tree, sums, key) for key in tree.parent}


def level_fs(tree: AccountTree, sums: dict[str, Dyadic], key: str) -> float:
    """The Level FS of node ``key`` (not root), from the tree's ``exact_sums``: ``math.inf`` without usage."""
    ratio = _level_ratio(tree, sums, key)
    return math.inf if ratio is None else to_float(Fraction(*ratio))


#: A Level FS as an exact ratio of two integers; None for infinite (no usage).
Ratio = tuple[int, int] | None


def _level_ratio(tree: AccountTree, sums: dict[str, Dyadic], key: str) -> Ratio:
    """Level FS ``share * used[parent] / used[key]`` of node ``key``, exactly, with share = its shares over
    its siblings' and used = num / 2 ** k (``exact_sums``)."""
    num, k = sums[key]
    if num == 0:
        return None
    parent = tree.parent[key]
    pnum, pk = sums[parent]
    return (tree.shares[key] * pnum) << k, (_shape(tree).level[parent] * num) << pk


def level_shares(tree: AccountTree, account: str) -> int:
    """The raw shares of ``account``'s children, summed (a child's NormShares is its shares over them)."""
    return _shape(tree).level[account]


def tree_of(
    accounts: tuple[Account, ...], associations: tuple[UserAssoc, ...], users: set[str]
) -> AccountTree:
    """``build_tree(accounts, associations, users)``, built again only when the tables or the users without
    an association change (a site has thousands of associations; every cycle and sshare asks)."""
    kept = _KEPT[0] if _KEPT else None
    if kept is None or kept.accounts is not accounts or kept.associations is not associations:
        associated = frozenset(a.user for a in associations)
    else:
        associated = kept.associated
    extra = frozenset(users - associated)
    if kept is None or kept.associated is not associated or kept.extra != extra:
        tree = build_tree(accounts, associations, sorted(extra))
        _KEPT[:] = [_KeptTree(accounts, associations, associated, extra, tree)]
        return tree
    return kept.tree


class _KeptTree(NamedTuple):
    """The last tree built (``tree_of``), with what it was built from."""

    accounts: tuple[Account, ...]
    associations: tuple[UserAssoc, ...]
    associated: frozenset[str]  # the users with an association
    extra: frozenset[str]  # the users given a default association
    tree: AccountTree


_KEPT: list[_KeptTree] = []


def to_float(value: Fraction) -> float:
    """``value`` as a float; ``math.inf`` past the largest (a usage decayed for a thousand half-lives, beside
    a sibling's, is a Level FS beyond 1.8e308)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def fair_tree_factors(
    tree: AccountTree, usage: Usage, at: float, half_life_s: float, wanted: Collection[str] | None = None
) -> dict[str, float]:
    """Fair Tree factor of every user association key (see the module docstring); of the ``wanted`` keys
    only when given (the users of the pending jobs: only the levels above them are ranked, a subtree without
    one counts its users)."""
    shape = _shape(tree)
    sums = exact_sums(tree, usage, at, half_life_s)
    n = len(tree.users)
    relevant = None if wanted is None else _with_ancestors(tree, wanted)
    factors: dict[str, float] = {}
    ranked = 0  # users ranked so far (those of skipped subtrees counted)

    def compare(a: tuple[Ratio, str], b: tuple[Ratio, str]) -> int:
        """Infinite Level FS first, then the higher, exactly (cross-multiplied); then by key."""
        order = _compare_lf(a[0], b[0])
        return order if order else (a[1] > b[1]) - (a[1] < b[1])

    def descend(siblings: list[str]) -> None:
        nonlocal ranked
        ordered = sorted(((_level_ratio(tree, sums, key), key) for key in siblings), key=cmp_to_key(compare))
        groups: list[list[str]] = []
        for k, (lf, key) in enumerate(ordered):
            if k and _compare_lf(ordered[k - 1][0], lf) == 0:
                groups[-1].append(key)
            else:
                groups.append([key])
        for tied in groups:
            rank = n - ranked  # the rank the group's first user gets
            merged = [kid for key in tied for kid in tree.children.get(key, [])]
            if merged:
                if relevant is None or any(key in relevant for key in tied if key in tree.children):
                    descend(merged)
                else:
                    ranked += sum(shape.leaves[key] for key in tied if key in tree.children)
            for key in tied:
                if key not in tree.children:
                    ranked += 1
                    if relevant is None or key in relevant:
                        factors[key] = rank / n

    descend(tree.children[ROOT])
    keys = tree.users if wanted is None else sorted(k for k in set(wanted) if k in factors)
    return {key: factors[key] for key in keys}


def _compare_lf(a: Ratio, b: Ratio) -> int:
    """-1 if Level FS ``a`` ranks first (is higher), 1 if ``b`` does, 0 if they are equal (None: infinite)."""
    if a is None or b is None:
        return (a is not None) - (b is not None)
    left, right = a[0] * b[1], b[0] * a[1]
    return (left < right) - (left > right)


def _with_ancestors(tree: AccountTree, keys: Collection[str]) -> set[str]:
    """``keys`` that are nodes of the tree, and every account above them."""
    out: set[str] = set()
    for key in keys:
        while key in tree.shares and key not in out:
            out.add(key)
            key = tree.parent.get(key, "")
    return out


class _Shape(msgspec.Struct):
    """What depends on a tree alone, computed once per tree (the policy's is the same for every cycle)."""

    order: list[str]  # every node, each account before its children (``_depth_first``)
    leaves: dict[str, int]  # how many user associations hang beneath each account (1 for a user)
    shares: dict[str, Fraction]  # ``_shares_norm``
    users: frozenset[str]  # ``tree.users``
    level: dict[str, int]  # each account's children's raw shares, summed


def _shape(tree: AccountTree) -> _Shape:
    """The tree's ``_Shape``, kept for the last tree asked (trees are immutable; one policy, one tree)."""
    kept = _SHAPE.get(id(tree))
    if kept is not None and kept[0] is tree:
        return kept[1]
    order = _depth_first(tree)
    leaves: dict[str, int] = {}
    for key in reversed(order):
        kids = tree.children.get(key)
        leaves[key] = 1 if kids is None else sum(leaves[kid] for kid in kids)
    level = {acc: sum(tree.shares[k] for k in kids) for acc, kids in tree.children.items()}
    shape = _Shape(order, leaves, _shares_norm(tree), frozenset(tree.users), level)
    _SHAPE.clear()
    _SHAPE[id(tree)] = (tree, shape)
    return shape


_SHAPE: dict[int, tuple[AccountTree, _Shape]] = {}


def classic_factors(
    tree: AccountTree, usage: Usage, at: float, half_life_s: float, wanted: Collection[str] | None = None
) -> dict[str, float]:
    """Classic ``2 ** (-U_E / S)`` of every user association key (see the module docstring); of the
    ``wanted`` keys only when given (each needs the accounts above it alone)."""
    sums = exact_sums(tree, usage, at, half_life_s)
    total: Dyadic = (0, 0)
    for key, entry in usage.by_key.items():  # every key charged, in the tree or no longer
        total = _add(total, sums[key] if key in sums else _dyadic(_decay(entry, at, half_life_s)))
    total_value = Fraction(total[0], 1 << total[1])
    shares = _shape(tree).shares
    norm_shares: dict[str, Fraction] = {ROOT: Fraction(1)}
    effective: dict[str, Fraction] = {}

    def resolve(key: str) -> None:
        """``norm_shares`` and ``effective`` of ``key``, its accounts' first."""
        parent, share = tree.parent[key], shares[key]
        if parent != ROOT and parent not in effective:
            resolve(parent)
        norm_shares[key] = norm_shares[parent] * share
        num, k = sums[key]
        actual = Fraction(num, 1 << k) / total_value if total_value else Fraction()
        effective[key] = actual if parent == ROOT else actual + (effective[parent] - actual) * share

    keys = tree.users if wanted is None else sorted(_shape(tree).users.intersection(wanted))
    factors: dict[str, float] = {}
    for key in keys:
        if key not in effective:
            resolve(key)
        factors[key] = math.pow(2.0, -to_float(effective[key] / norm_shares[key]))
    return factors
