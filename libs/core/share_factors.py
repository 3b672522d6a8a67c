"""The fair-share factors of the tree and usage of ``fair_share.py`` (Slurm's priority/multifactor), pure.

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
node's usage is summed as integers (``exact_sums``), Fair Tree compares Level FS by cross-multiplying
integers, and classic's ratios run on `fractions.Fraction`.

**Cost.** A scheduling cycle asks for the factors of its pending jobs' associations only (``wanted``): Fair
Tree ranks the levels above them and counts the users of the subtrees without one; classic walks the
accounts above each. The usage sums still visit the whole tree once a cycle. What depends on the tree alone
(its order, leaf counts, share fractions) is kept per tree (``fair_share.tree_shape``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from fractions import Fraction
from functools import cmp_to_key

from corral.libs.core.fair_share import ROOT, AccountTree, Usage, decay, tree_shape

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
    for key in reversed(tree_shape(tree).order):  # children before their account
        kids = children.get(key)
        if kids is None:
            entry = charged.get(key)
            if entry is None:
                out[key] = (0, 0)
            else:
                out[key] = _dyadic(decay(entry, at, half_life_s))
            continue
        parts = [out[kid] for kid in kids]
        top = max((k for _, k in parts), default=0)
        out[key] = (sum(num << (top - k) for num, k in parts), top)
    return out


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
    return (tree.shares[key] * pnum) << k, (tree_shape(tree).level[parent] * num) << pk


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
    shape = tree_shape(tree)
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


def classic_factors(
    tree: AccountTree, usage: Usage, at: float, half_life_s: float, wanted: Collection[str] | None = None
) -> dict[str, float]:
    """Classic ``2 ** (-U_E / S)`` of every user association key (see the module docstring); of the
    ``wanted`` keys only when given (each needs the accounts above it alone)."""
    sums = exact_sums(tree, usage, at, half_life_s)
    total: Dyadic = (0, 0)
    for key, entry in usage.by_key.items():  # every key charged, in the tree or no longer
        total = _add(total, sums[key] if key in sums else _dyadic(decay(entry, at, half_life_s)))
    total_value = Fraction(total[0], 1 << total[1])
    shares = tree_shape(tree).shares
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

    keys = tree.users if wanted is None else sorted(tree_shape(tree).users.intersection(wanted))
    factors: dict[str, float] = {}
    for key in keys:
        if key not in effective:
            resolve(key)
        factors[key] = math.pow(2.0, -to_float(effective[key] / norm_shares[key]))
    return factors
