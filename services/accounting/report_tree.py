"""sreport ``cluster AccountUtilizationByUser``: the account tree's rows with their sums, pure.

Slurm (``src/api/cluster_report_functions.c``, ``slurmdb_get_hierarchical_sorted_assoc_list`` in
``src/common/slurmdb_defs.c``) lists the associations that have usage in the window as the account tree:

- an account's row is the usage of its whole subtree (its users' and its sub-accounts'); ``root``'s is
  every association's;
- depth first from the top: each account's row, then its users' rows, then its sub-accounts, siblings
  by name (byte order);
- an association without usage in the window is left out, so an account appears when anything beneath
  it was used, even if none of it was its own users';
- ``accounts=A`` shows the subtrees of A (A's own row on top, no ``root``); ``users=U`` shows only the
  user rows of U (no account rows), each at the top, by user name.

``account_rows`` computes those rows; the command only formats them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.libs.core.fair_share import ROOT
from corral.schemas.api import AssocUsage


def lineage(account: str, parents: Mapping[str, str]) -> list[str]:
    """``account`` and its ancestors up to ``root`` (an account ``parents`` does not know is under root)."""
    chain = [account]
    while chain[-1] != ROOT and len(chain) <= len(parents) + 1:
        chain.append(parents.get(chain[-1], ROOT))
    return chain


def account_rows(
    used: Mapping[tuple[str, str], Sequence[float]],
    parents: Mapping[str, str],
    users: Sequence[str] = (),
    accounts: Sequence[str] = (),
) -> list[AssocUsage]:
    """The report's rows in Slurm's order.

    ``used``: every (account, user) that ran in the window, with its TRES-seconds (one per TRES).
    ``parents``: each configured account's parent account. ``users``/``accounts``: sreport's filters.
    """
    width = len(next(iter(used.values()), ()))
    scope = set(accounts)

    def in_scope(account: str) -> bool:
        return not scope or ROOT in scope or not scope.isdisjoint(lineage(account, parents))

    totals: dict[str, list[float]] = {}
    shown_users: list[tuple[str, str]] = []
    for (account, user), seconds in sorted(used.items()):
        if in_scope(account) and (not users or user in users):
            shown_users.append((account, user))
        for name in lineage(account, parents):
            if not users and in_scope(name):
                total = totals.setdefault(name, [0.0] * width)
                total[:] = [a + b for a, b in zip(total, seconds, strict=True)]
    # Each shown row hangs under its parent when that is shown, else at the top.
    children: dict[str | None, list[tuple[int, str, str]]] = {}
    for account in totals:
        parent = None if account == ROOT else parents.get(account, ROOT)
        children.setdefault(parent if parent in totals else None, []).append((1, account, ""))
    for account, user in shown_users:
        children.setdefault(account if account in totals else None, []).append((0, user, account))
    rows: list[AssocUsage] = []

    def walk(parent: str | None, depth: int) -> None:
        # Users (kind 0) before sub-accounts (kind 1), each by name.
        for kind, name, account in sorted(children.get(parent, [])):
            if kind == 0:
                rows.append(
                    AssocUsage(account=account, user=name, depth=depth, seconds=list(used[account, name]))
                )
            else:
                rows.append(AssocUsage(account=name, depth=depth, seconds=totals[name]))
                walk(name, depth + 1)

    walk(None, 0)
    return rows
