"""The fair-share tree as ``sshare`` shows it, pure: one row per account and user association.

Columns (Slurm's sshare, computed from ``fair_share.py``):

- RawShares: the association's shares; NormShares: its shares over its siblings' shares;
- RawUsage: its usage decayed to now (TRES-seconds; an account's is the sum beneath it);
- EffectvUsage: its usage over its parent's usage (0 when the parent has none);
- FairShare: a user association's fair-share factor (Fair Tree or classic, as the scheduler uses);
  accounts have none;
- LevelFS (``sshare -l``): its shares over its usage, relative to its siblings; None = infinite.

The tree holds the configured accounts and associations and a default association for every user
``users`` names (the scheduler passes every user with a job or with usage); rows come depth first,
root first, children by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from corral.libs.core.fair_share import (
    ROOT,
    AccountTree,
    Usage,
    build_tree,
    classic_factors,
    decayed,
    fair_tree_factors,
    level_fairshare,
)
from corral.libs.core.policy import Policy
from corral.schemas import api


def share_rows(
    policy: Policy, usage: Usage, now: float, half_life_s: float, users: Iterable[str]
) -> list[api.ShareInfo]:
    """Every association of the tree with its shares, usage and factors, depth first from root."""
    tree = build_tree(policy.accounts, policy.associations, sorted(set(users)))
    factors = fair_tree_factors if policy.fairshare == "fair_tree" else classic_factors
    fairshare = factors(tree, usage, now, half_life_s)
    level = level_fairshare(tree, usage, now, half_life_s)
    used = _usage(tree, usage, now, half_life_s)
    rows: list[api.ShareInfo] = []

    def visit(key: str, depth: int) -> None:
        parent = tree.parent.get(key)
        siblings = tree.children[parent] if parent is not None else [key]
        total_shares = sum(tree.shares[k] for k in siblings)
        account, _, user = key.rpartition("/") if key not in tree.children else (key, "", "")
        parent_used = used[parent] if parent is not None else used[key]
        lfs = level.get(key)
        rows.append(
            api.ShareInfo(
                account=account,
                user=user,
                depth=depth,
                raw_shares=tree.shares[key],
                norm_shares=tree.shares[key] / total_shares,
                raw_usage=used[key],
                effective_usage=used[key] / parent_used if parent_used > 0 else 0.0,
                fairshare=fairshare.get(key),
                level_fs=None if lfs is None or math.isinf(lfs) else lfs,
            )
        )
        for child in tree.children.get(key, []):
            visit(child, depth + 1)

    visit(ROOT, 0)
    return rows


def _usage(tree: AccountTree, usage: Usage, now: float, half_life_s: float) -> dict[str, float]:
    """Every node's decayed usage: a user association's own, an account's the sum beneath it."""
    out: dict[str, float] = {}

    def visit(key: str) -> float:
        kids = tree.children.get(key)
        own = decayed(usage, key, now, half_life_s) if kids is None else sum(visit(k) for k in kids)
        out[key] = own
        return own

    visit(ROOT)
    return out
