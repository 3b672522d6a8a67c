"""``sshare``: the fair-share tree (shares, usage, factors), from the scheduler's ``shares`` verb.

    sshare [-a] [-l] [-n] [-P] [-u USERS] [-A ACCOUNTS]

Columns as Slurm's: Account User RawShares NormShares RawUsage EffectvUsage FairShare (``-l`` adds
LevelFS). Without ``-a`` or ``-u`` only the caller's associations are shown, with the accounts above
them; ``-A`` keeps the named accounts and what is beneath them. RawUsage is TRES-seconds decayed to
now (GPU-seconds by default, see the billing weights). Rendering is pure: ``render_shares``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from corral.cli.errors import CliError, run_command
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported, version_text

if TYPE_CHECKING:
    from corral.schemas.api import ShareInfo

COMMAND = "sshare"

OPTIONS = OptionTable(
    [
        flag("all", "a"),
        flag("long", "l"),
        flag("noheader", "n"),
        flag("parsable", "P"),
        Opt("users", "u"),
        Opt("accounts", "A"),
        flag("help", "h"),
        flag("usage"),
        flag("version", "V"),
        *unsupported("clusters/M format/o json yaml partition/m tres/t verbose/v parsable2/p"),
    ]
)

USAGE = """\
Usage: sshare [OPTIONS...]
  -a, --all              every user                 -u, --users=USERS      only these users
  -A, --accounts=NAMES   only these accounts        -l, --long             also LevelFS
  -n, --noheader         no header lines            -P, --parsable         '|'-separated, no padding
"""

#: (title, width) of each column; ``-l`` adds LevelFS.
COLUMNS = [
    ("Account", 20),
    ("User", 10),
    ("RawShares", 10),
    ("NormShares", 11),
    ("RawUsage", 11),
    ("EffectvUsage", 13),
    ("FairShare", 10),
]
LEVEL_FS = ("LevelFS", 10)


def _cells(row: ShareInfo, long: bool) -> list[str]:
    root = row.depth == 0
    account = " " * (row.depth - (1 if row.user else 0)) + row.account if not root else row.account
    cells = [
        account,
        row.user,
        "" if root else str(row.raw_shares),
        "" if root else f"{row.norm_shares:.6f}",
        str(round(row.raw_usage)),
        f"{row.effective_usage:.6f}" if not root else "1.000000",
        "" if row.fairshare is None else f"{row.fairshare:.6f}",
    ]
    if long:
        cells.append("" if root else "inf" if row.level_fs is None else f"{row.level_fs:.6f}")
    return cells


def render_shares(rows: Sequence[ShareInfo], *, long: bool, header: bool, parsable: bool) -> list[str]:
    """The output lines: the titles and a dashed line (unless ``-n``), then one line per association."""
    columns = COLUMNS + ([LEVEL_FS] if long else [])
    table = [_cells(row, long) for row in rows]
    if parsable:
        lines = [[title for title, _ in columns]] if header else []
        return ["|".join(cells) + "|" for cells in lines + table]
    out = []
    if header:
        out.append(" ".join(title.rjust(width) for title, width in columns))
        out.append(" ".join("-" * width for _, width in columns))
    for cells in table:
        # The account is left-aligned (with its depth's indent), the other columns right-aligned.
        parts = [cells[0][: columns[0][1]].ljust(columns[0][1])]
        parts += [
            value[:width].rjust(width) for value, (_, width) in zip(cells[1:], columns[1:], strict=True)
        ]
        out.append(" ".join(parts))
    return out


def _sshare(argv: list[str]) -> int:
    args = OPTIONS.parse(argv)
    if args.given("help") or args.given("usage"):
        sys.stdout.write(USAGE)
        return 0
    if args.given("version"):
        print(version_text())
        return 0
    if args.positionals:
        raise CliError(f"unrecognized argument '{args.positionals[0]}'")
    from corral.cli.client import find_cluster
    from corral.schemas.api import SharesRequest

    request = SharesRequest(
        users=args.items("users"), accounts=args.items("accounts"), all_users=args.given("all")
    )
    reply = find_cluster().shares(request)
    lines = render_shares(
        reply.rows,
        long=args.given("long"),
        header=not args.given("noheader"),
        parsable=args.given("parsable"),
    )
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sshare``."""
    return run_command(COMMAND, _sshare, argv)


if __name__ == "__main__":
    sys.exit(main())
