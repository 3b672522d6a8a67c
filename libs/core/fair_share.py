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

**Exactness.** Sums, ratios and comparisons run on `fractions.Fraction` of the stored floats: the
result does not depend on dict order (float sums would), ties are exact, and more usage can never
round into a better factor. Results are converted to float once, at the end.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from itertools import groupby

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


def _node_usage(tree: AccountTree, usage: Usage, at: float, half_life_s: float) -> dict[str, Fraction]:
    """Exact usage of every node: a user's own, an account's the sum of its children's."""
    out: dict[str, Fraction] = {}

    def visit(key: str) -> Fraction:
        kids = tree.children.get(key)
        own = (
            Fraction(decayed(usage, key, at, half_life_s))
            if kids is None
            else sum(map(visit, kids), Fraction())
        )
        out[key] = own
        return own

    visit(ROOT)
    return out


def _shares_norm(tree: AccountTree) -> dict[str, Fraction]:
    """Every node's shares over its siblings' shares (itself included), root excluded."""
    level = {acc: sum(tree.shares[k] for k in kids) for acc, kids in tree.children.items()}
    return {key: Fraction(tree.shares[key], level[parent]) for key, parent in tree.parent.items()}


def _level_fs(tree: AccountTree, used: dict[str, Fraction]) -> dict[str, Fraction | None]:
    """Level Fairshare of every node but root, exact; None = infinite (no usage)."""
    return {
        key: None if used[key] == 0 else share * used[tree.parent[key]] / used[key]
        for key, share in _shares_norm(tree).items()
    }


def level_fairshare(tree: AccountTree, usage: Usage, at: float, half_life_s: float) -> dict[str, float]:
    """Level FS of every node but root (``sshare -l``); ``math.inf`` for a node without usage."""
    lfs = _level_fs(tree, _node_usage(tree, usage, at, half_life_s))
    return {key: math.inf if lf is None else float(lf) for key, lf in lfs.items()}


def fair_tree_factors(tree: AccountTree, usage: Usage, at: float, half_life_s: float) -> dict[str, float]:
    """Fair Tree factor of every user association key (see the module docstring)."""
    lfs = _level_fs(tree, _node_usage(tree, usage, at, half_life_s))
    n = len(tree.users)
    factors: dict[str, float] = {}

    def order(key: str) -> tuple[bool, Fraction]:
        lf = lfs[key]  # infinite first, then by descending LF
        return (lf is not None, -lf if lf is not None else Fraction())

    def descend(siblings: list[str]) -> None:
        for _, group in groupby(sorted(siblings, key=lambda k: (order(k), k)), key=order):
            tied = list(group)
            rank = n - len(factors)  # the rank the group's first user gets
            merged = [kid for key in tied for kid in tree.children.get(key, [])]
            if merged:
                descend(merged)
            factors.update({key: rank / n for key in tied if key not in tree.children})

    descend(tree.children[ROOT])
    return {key: factors[key] for key in tree.users}


def classic_factors(tree: AccountTree, usage: Usage, at: float, half_life_s: float) -> dict[str, float]:
    """Classic ``2 ** (-U_E / S)`` of every user association key (see the module docstring)."""
    used = _node_usage(tree, usage, at, half_life_s)
    total = sum((Fraction(decayed(usage, k, at, half_life_s)) for k in usage.by_key), Fraction())
    shares = _shares_norm(tree)
    norm_shares: dict[str, Fraction] = {ROOT: Fraction(1)}
    effective: dict[str, Fraction] = {}
    factors: dict[str, float] = {}
    todo = list(tree.children[ROOT])
    while todo:
        key = todo.pop()
        parent, share = tree.parent[key], shares[key]
        norm_shares[key] = norm_shares[parent] * share
        actual = used[key] / total if total else Fraction()
        effective[key] = actual if parent == ROOT else actual + (effective[parent] - actual) * share
        if key in tree.children:
            todo.extend(tree.children[key])
        else:
            factors[key] = math.pow(2.0, -float(effective[key] / norm_shares[key]))
    return {key: factors[key] for key in tree.users}
