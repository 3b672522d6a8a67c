"""Fair share (the fair-share factor of Slurm's priority/multifactor), pure.

**Tree.** Accounts form a tree under ``root``; users hang off accounts as leaves ("user
associations", key ``account/user``). Every node has raw shares; a node's share of its parent is
its shares over the shares of its siblings (itself included).

**Usage** is billed in TRES-seconds (`billing`, Slurm's TRESBillingWeights summed, i.e. without
PriorityFlags=MAX_TRES) and decays exponentially with a half-life:
``v(t) = v(t0) * 0.5 ** ((t - t0) / half_life)``. It is stored only per user association, with the
time it was last decayed, and decayed lazily (when charged or read); an account's usage is the sum
of the associations beneath it, computed when needed, so a charge touches one entry.

The factors computed from the tree and the usage (Fair Tree, classic, Level FS) are in
``share_factors.py``. What depends on the tree alone (its order, each account's leaf count and its
children's shares summed, the share fractions) is kept per tree (``tree_shape``), and the policy's tree
across cycles (``tree_of``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
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


def decay(entry: Charged, at: float, half_life_s: float) -> float:
    """``entry`` decayed to ``at``; no decay with a half-life <= 0 (Slurm: decay disabled) or
    for a time before the entry's (the log's clock never goes back)."""
    if half_life_s <= 0 or at <= entry.at:
        return entry.value
    return entry.value * math.pow(0.5, (at - entry.at) / half_life_s)


def decayed(usage: Usage, key: str, at: float, half_life_s: float) -> float:
    """The usage of association ``key`` at ``at`` (0 if never charged)."""
    entry = usage.by_key.get(key)
    return 0.0 if entry is None else decay(entry, at, half_life_s)


def charge(usage: Usage, key: str, amount: float, at: float, half_life_s: float) -> None:
    """Add ``amount`` TRES-seconds to ``key`` at ``at``, first decaying what it had to ``at``."""
    if not math.isfinite(amount) or amount < 0:
        raise ValueError(f"usage charged to {key!r} must be finite and >= 0, not {amount}")
    entry = usage.by_key.get(key)
    last = at if entry is None else max(entry.at, at)
    usage.by_key[key] = Charged(decayed(usage, key, at, half_life_s) + amount, last)


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


def level_shares(tree: AccountTree, account: str) -> int:
    """The raw shares of ``account``'s children, summed (a child's NormShares is its shares over them)."""
    return tree_shape(tree).level[account]


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


class TreeShape(msgspec.Struct):
    """What depends on a tree alone, computed once per tree (the policy's is the same for every cycle)."""

    order: list[str]  # every node, each account before its children (``_depth_first``)
    leaves: dict[str, int]  # how many user associations hang beneath each account (1 for a user)
    shares: dict[str, Fraction]  # ``_shares_norm``
    users: frozenset[str]  # ``tree.users``
    level: dict[str, int]  # each account's children's raw shares, summed


def tree_shape(tree: AccountTree) -> TreeShape:
    """The tree's ``TreeShape``, kept for the last tree asked (trees are immutable; one policy, one tree)."""
    kept = _SHAPES.get(id(tree))
    if kept is not None and kept[0] is tree:
        return kept[1]
    order = _depth_first(tree)
    leaves: dict[str, int] = {}
    for key in reversed(order):
        kids = tree.children.get(key)
        leaves[key] = 1 if kids is None else sum(leaves[kid] for kid in kids)
    level = {acc: sum(tree.shares[k] for k in kids) for acc, kids in tree.children.items()}
    shape = TreeShape(order, leaves, _shares_norm(tree), frozenset(tree.users), level)
    _SHAPES.clear()
    _SHAPES[id(tree)] = (tree, shape)
    return shape


_SHAPES: dict[int, tuple[AccountTree, TreeShape]] = {}
