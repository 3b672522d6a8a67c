"""The fair-share tree as ``sshare`` shows it, pure: one row per account and user association.

Columns (Slurm's sshare, computed from ``fair_share.py`` and ``share_factors.py``):

- RawShares: the association's shares; NormShares: its shares over its siblings' shares;
- RawUsage: its usage decayed to now (TRES-seconds; an account's is the sum beneath it);
- EffectvUsage: its usage over its parent's usage (0 when the parent has none);
- FairShare: a user association's fair-share factor (Fair Tree or classic, as the scheduler uses);
  accounts have none;
- LevelFS (``sshare -l``): its shares over its usage, relative to its siblings; None = infinite.

The tree holds the configured accounts and associations and a default association for every user
``users`` names (the scheduler passes every user with a job or with usage); rows come depth first,
root first, children by name. Which rows a request shows depends on the tree alone (``shown``); only their
numbers are computed, each row as it is asked for (a reply's page stops asking).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Iterator

from corral.libs.core.fair_share import ROOT, AccountTree, Usage, decayed, level_shares, tree_of
from corral.libs.core.policy import Policy
from corral.libs.core.share_factors import classic_factors, exact_sums, fair_tree_factors, level_fs
from corral.schemas import api


def share_rows(
    policy: Policy,
    usage: Usage,
    now: float,
    half_life_s: float,
    users: Iterable[str],
    only: Collection[str] | None = None,
    accounts: Collection[str] = (),
    start: int = 0,
) -> Iterator[api.ShareInfo]:
    """The rows sshare shows, depth first from root, from the ``start``-th on (``shown``: ``only`` users'
    associations, all with None, within ``accounts``); each computed as it is asked for (a reply's page
    stops asking), the factors of every association shown from ``start``."""
    tree = tree_of(policy.accounts, policy.associations, set(users))
    keys = shown(tree, only, accounts)[start:]
    compute = fair_tree_factors if policy.fairshare == "fair_tree" else classic_factors
    fairshare = compute(tree, usage, now, half_life_s, [key for key, _ in keys if key not in tree.children])
    sums = exact_sums(tree, usage, now, half_life_s)
    used = _usage(tree, usage, now, half_life_s)
    for key, depth in keys:
        parent = tree.parent.get(key)
        total_shares = level_shares(tree, parent) if parent is not None else tree.shares[key]
        account, _, user = key.rpartition("/") if key not in tree.children else (key, "", "")
        parent_used = used[parent] if parent is not None else used[key]
        lfs = level_fs(tree, sums, key) if parent is not None else None
        yield api.ShareInfo(
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


def shown(
    tree: AccountTree, only: Collection[str] | None, accounts: Collection[str]
) -> list[tuple[str, int]]:
    """The nodes sshare shows, with their depth, depth first: the associations of the ``only`` users (every
    user's with None) inside ``accounts`` (an account and what is beneath it; all without), the accounts
    above them, and with None every account inside; root always."""
    rows: list[tuple[str, int, bool]] = []  # (key, depth, a user's)
    marked: set[str] = {ROOT}  # the accounts shown
    path: list[str] = []  # the accounts from root down to the current node's parent

    def visit(key: str, depth: int) -> None:
        del path[depth:]
        kids = tree.children.get(key)
        account = key if kids is not None else tree.parent[key]
        lineage = (*path, account)  # its account and every account above it
        inside = not accounts or any(a in accounts for a in lineage)
        if kids is None:
            if inside and (only is None or key.rpartition("/")[2] in only):
                marked.update(lineage)
                rows.append((key, depth, True))
            return
        if inside and only is None:
            marked.add(key)
        rows.append((key, depth, False))
        path.append(key)
        for child in kids:
            visit(child, depth + 1)

    visit(ROOT, 0)
    return [(key, depth) for key, depth, user in rows if user or key in marked]


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
