"""sreport's reports, pure: a ``ReportReply`` in, Slurm's lines out.

Slurm's layout: a banner (a line of 80 dashes, the report's title and window, the unit, dashes again), the
column titles, a line of dashes, then one line per row. Each field is right-justified in its width and
followed by one space; a value too long keeps its start and ends in ``+``. ``-P`` (``--parsable2``) joins
the fields with ``|``, ``-p`` adds a trailing ``|``; ``-n`` drops the banner and the titles.

Values are TRES-seconds in the unit of ``-t``: Seconds, Minutes (the default), Hours (whole units, cut as
Slurm does), Percent of the cluster's reported capacity (``12.34%``), or both (``SecPer``: ``90(1.04%)``).
"""

from __future__ import annotations

import pwd
from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import TYPE_CHECKING, Literal

import msgspec

from corral.libs.slurm.timefmt import format_timestamp

if TYPE_CHECKING:
    from corral.schemas.api import ReportReply, TresCapacity

TimeFormat = Literal["seconds", "minutes", "hours", "percent", "secper", "minper", "hourper"]
#: What the banner's "Usage reported in ..." names for each format.
FORMAT_NAMES: dict[str, str] = {
    "seconds": "Seconds",
    "minutes": "Minutes",
    "hours": "Hours",
    "percent": "Percentage of Total",
    "secper": "Seconds/Percentage of Total",
    "minper": "Minutes/Percentage of Total",
    "hourper": "Hours/Percentage of Total",
}
_DIVISOR = {"seconds": 1, "minutes": 60, "hours": 3600, "secper": 1, "minper": 60, "hourper": 3600}
_DASHES = "-" * 80


class Layout(msgspec.Struct, frozen=True, kw_only=True):
    """How to print: the unit, the parsable form, the header, whether --tres was given, the time zone."""

    time_format: TimeFormat = "minutes"  # -t
    parsable: str | None = None  # None: fixed width; "P": --parsable2; "p": --parsable
    header: bool = True  # -n turns banner and titles off
    tres_given: bool = False  # --tres: Slurm's TRES Name column instead of Energy
    tz: tzinfo | None = None  # time zone of the banner; None = local
    proper_name: Callable[[str], str] = lambda user: ""  # a login's full name (Proper Name)
    tree: bool = False  # AccountUtilizationByUser's ``tree``: indent accounts by depth


def usage_text(seconds: float, total: float, time_format: TimeFormat) -> str:
    """One usage value in ``time_format``: whole units (cut, as Slurm's integer division), a percentage
    of ``total`` with two decimals, or both."""
    used = int(seconds)
    percent = 100.0 * used / total if total > 0 else 0.0
    if time_format == "percent":
        return f"{percent:.2f}%"
    amount = str(used // _DIVISOR[time_format])
    return f"{amount}({percent:.2f}%)" if time_format.endswith("per") else amount


def _width(time_format: TimeFormat, plain: int, per: int) -> int:
    return per if time_format.endswith("per") else plain


def banner(title: str, reply: ReportReply, layout: Layout, with_secs: bool = True) -> list[str]:
    """The four banner lines: dashes, ``title start - end [(N secs)]``, the unit, dashes."""
    start = format_timestamp(reply.start, layout.tz)
    end = format_timestamp(reply.end - 1, layout.tz)
    window = f"{title} {start} - {end}" + (f" ({int(reply.end - reply.start)} secs)" if with_secs else "")
    if layout.time_format == "percent":
        unit = f"Usage reported in {FORMAT_NAMES['percent']}"
    else:
        kind = "CPU" if [c.tres for c in reply.capacity] == ["cpu"] and not layout.tres_given else "TRES"
        unit = f"Usage reported in {kind} {FORMAT_NAMES[layout.time_format]}"
    return [_DASHES, window, unit, _DASHES]


def table(columns: Sequence[tuple[str, int]], rows: Sequence[Sequence[str]], layout: Layout) -> list[str]:
    """Titles, dashes and rows, fixed-width or parsable (widths of usage columns grow to fit, as Slurm's)."""
    if layout.parsable is not None:
        end = "|" if layout.parsable == "p" else ""
        lines = [[title for title, _ in columns]] if layout.header else []
        return ["|".join(cells) + end for cells in [*lines, *rows]]
    out = []
    if layout.header:
        out.append("".join(_cell(title, width, cut="") for title, width in columns))
        out.append("".join("-" * abs(width) + " " for _, width in columns))
    out += ["".join(_cell(v, w) for v, (_, w) in zip(cells, columns, strict=True)) for cells in rows]
    return out


def _cell(value: str, width: int, cut: str = "+") -> str:
    """``value`` in ``width`` columns and a space: right-justified, left-justified if ``width`` < 0 (as
    Slurm's print fields), a value too long cut to end in ``cut``."""
    size = abs(width)
    if len(value) > size:
        value = value[: size - len(cut)] + cut
    return (value.rjust(size) if width > 0 else value.ljust(size)) + " "


def _fit(columns: list[tuple[str, int]], rows: list[list[str]], titles: set[str]) -> list[tuple[str, int]]:
    """Widen the usage columns to their longest value (Slurm's sreport_set_usage_column_width)."""
    fitted = []
    for index, (title, width) in enumerate(columns):
        if title in titles:
            width = max([width, *(len(row[index]) for row in rows)])
        fitted.append((title, width))
    return fitted


def _capacity(reply: ReportReply) -> dict[str, TresCapacity]:
    return {c.tres: c for c in reply.capacity}


def cluster_utilization(reply: ReportReply, layout: Layout) -> list[str]:
    """``sreport cluster utilization``: Allocated, Down, PLND Down, Idle, Planned, Reported per TRES.

    Corral has no planned downtime and no reservations' idle time of its own: both print 0. Idle is what
    is left of Reported.
    """
    fmt = layout.time_format
    usage = [
        ("Allocated", _width(fmt, 12, 20)),
        ("Down", _width(fmt, 10, 18)),
        ("PLND Down", _width(fmt, 10, 18)),
        ("Idle", _width(fmt, 12, 20)),
        ("Planned", _width(fmt, 9, 18)),
        ("Reported", _width(fmt, 12, 20)),
    ]
    columns = [("Cluster", 9), *([("TRES Name", 14)] if layout.tres_given else []), *usage]
    rows = []
    for cap in reply.capacity:
        total = int(cap.reported)
        idle = max(0, total - int(cap.allocated) - int(cap.down))
        values = [cap.allocated, cap.down, 0, idle, 0, total]
        cells = [reply.cluster, *([cap.tres] if layout.tres_given else [])]
        rows.append(cells + [usage_text(v, total, fmt) for v in values])
    columns = _fit(columns, rows, {title for title, _ in usage})
    head = banner("Cluster Utilization", reply, layout, with_secs=False) if layout.header else []
    return head + table(columns, rows, layout)


def _used_column(layout: Layout) -> tuple[str, int]:
    return ("Used", _width(layout.time_format, 10, 18))


def _tail(layout: Layout, tres: str, seconds: float, total: float) -> list[str]:
    """The last cells of a usage row: TRES Name and Used with --tres, else Used and Energy."""
    used = usage_text(seconds, total, layout.time_format)
    return [tres, used] if layout.tres_given else [used, usage_text(0, total, layout.time_format)]


def _tail_columns(layout: Layout) -> list[tuple[str, int]]:
    energy = ("Energy", _width(layout.time_format, 10, 18))
    return [("TRES Name", 14), _used_column(layout)] if layout.tres_given else [_used_column(layout), energy]


def account_utilization_by_user(reply: ReportReply, layout: Layout) -> list[str]:
    """``sreport cluster AccountUtilizationByUser``: the service's rows (``report_tree``: root, then each
    account's total followed by its users and its sub-accounts, depth first), one line per TRES.

    With ``tree`` the Account column is 20 wide, left-justified, and each name is indented one space a
    level (a user's row one more than its account's), as Slurm's ``slurmdb_tree_name_get``.
    """
    rows: list[list[str]] = []
    for row in reply.accounts:
        shown = " " * row.depth + row.account if layout.tree else row.account
        name = layout.proper_name(row.user) if row.user else ""
        for cap, seconds in zip(reply.capacity, row.seconds, strict=True):
            rows.append(
                [reply.cluster, shown, row.user, name, *_tail(layout, cap.tres, seconds, cap.reported)]
            )
    account = ("Account", -20) if layout.tree else ("Account", 15)
    columns = [("Cluster", 9), account, ("Login", 9), ("Proper Name", 15), *_tail_columns(layout)]
    columns = _fit(columns, rows, {"Used", "Energy"})
    head = banner("Cluster/Account/User Utilization", reply, layout) if layout.header else []
    return head + table(columns, rows, layout)


def top_usage(reply: ReportReply, layout: Layout, top: int = 10, group: bool = False) -> list[str]:
    """``sreport user TopUsage``: the ``top`` user associations by usage of the first TRES (then by login,
    then account), one line per TRES. As Slurm's, each (user, account) is its own entry unless ``group``
    (one entry per user, its accounts joined by ", ")."""
    capacity = _capacity(reply)
    first = reply.capacity[0].tres if reply.capacity else "cpu"
    entries: dict[tuple[str, str], dict[str, float]] = {}
    for u in reply.usage:
        used = entries.setdefault((u.user, "" if group else u.account), {})
        used[u.tres] = used.get(u.tres, 0.0) + u.seconds

    def account(user: str, account: str) -> str:
        return account or ", ".join(sorted({u.account for u in reply.usage if u.user == user}))

    ranked = sorted(entries, key=lambda key: (-int(entries[key].get(first, 0.0)), key))[:top]
    rows = []
    for user, acct in ranked:
        for tres, cap in capacity.items():
            seconds = entries[user, acct].get(tres, 0.0)
            name = layout.proper_name(user)
            rows.append(
                [reply.cluster, user, name, account(user, acct), *_tail(layout, tres, seconds, cap.reported)]
            )
    columns = [("Cluster", 9), ("Login", 9), ("Proper Name", 15), ("Account", 15), *_tail_columns(layout)]
    columns = _fit(columns, rows, {"Used", "Energy"})
    head = banner(f"Top {top} Users", reply, layout) if layout.header else []
    return head + table(columns, rows, layout)


def gecos_name(user: str) -> str:
    """A login's full name as Slurm prints Proper Name: the first comma field of its GECOS, "" if none."""
    try:
        return pwd.getpwnam(user).pw_gecos.split(",")[0]
    except KeyError:
        return ""
