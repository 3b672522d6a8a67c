"""``sreport``: usage reports from the accounting service's ``report`` verb.

    sreport [-t FORMAT] [--tres=LIST] [-P|-p] [-n] cluster utilization [start=T] [end=T]
    sreport ... cluster AccountUtilizationByUser [tree] [start=T] [end=T] [users=L] [accounts=L]
    sreport ... user TopUsage [group] [start=T] [end=T] [users=L] [accounts=L] [TopCount=N]

As Slurm's: report names and keywords in any case (names may be shortened), the window defaults to
yesterday 00:00 until today 00:00, ``-t`` is Minutes unless told (Seconds, Hours, Percent, SecPer, MinPer,
HourPer, shortened as Slurm allows), ``--tres`` defaults to cpu. Times are sacct's
(``YYYY-MM-DD[THH:MM[:SS]]``, ``now-2days``, ``today``) or ``MM/DD[/YY]``. Rendering is in ``sreport_render``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, get_args

import msgspec

from corral.cli.errors import CliError, run_command
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported, version_text
from corral.cli.sacct_fields import parse_time_point
from corral.cli.sreport_render import (
    Layout,
    TimeFormat,
    account_utilization_by_user,
    cluster_utilization,
    gecos_name,
    top_usage,
)

if TYPE_CHECKING:
    from corral.schemas.api import ReportReply, ReportRequest

COMMAND = "sreport"

OPTIONS = OptionTable(
    [
        Opt("time-format", "t"),
        Opt("tres", "T"),
        flag("parsable2", "P"),
        flag("parsable", "p"),
        flag("noheader", "n"),
        flag("help", "h"),
        flag("usage"),
        flag("version", "V"),
        *unsupported("all_clusters/a cluster/M federation local quiet/Q verbose/v"),
    ]
)

USAGE = """\
Usage: sreport [OPTIONS...] REPORT [start=TIME] [end=TIME] [users=LIST] [accounts=LIST] [TopCount=N]
  REPORT: cluster utilization | cluster AccountUtilizationByUser [tree] | user TopUsage [group]
  -t FORMAT            Seconds, Minutes (default), Hours, Percent, SecPer, MinPer, HourPer
  -T, --tres=LIST      cpu (default), gres/gpu, or both
  -P, --parsable2      '|'-separated    -p, --parsable  ... with a trailing '|'    -n, --noheader
  TIME: YYYY-MM-DD[THH:MM[:SS]], MM/DD[/YY], now[-N<unit>], today (default: yesterday to today 00:00)
"""

#: (entity, report, shortest prefix of the report's name) -> the report's renderer key.
_REPORTS = {
    ("cluster", "utilization"): 2,
    ("cluster", "accountutilizationbyuser"): 8,
    ("user", "topusage"): 1,
}
_ENTITIES = {"cluster": 2, "user": 1}
#: -t names with the shortest prefix Slurm accepts.
_FORMATS: list[tuple[str, TimeFormat, int]] = [
    ("secper", "secper", 6),
    ("minper", "minper", 6),
    ("hourper", "hourper", 7),
    ("seconds", "seconds", 1),
    ("minutes", "minutes", 1),
    ("hours", "hours", 1),
    ("percent", "percent", 1),
]
_TRES_NAMES = ("cpu", "gres/gpu")


class SreportArgs(msgspec.Struct):
    """What an sreport command line asks for."""

    report: tuple[str, str] = ("cluster", "utilization")  # (entity, report), full lower-case names
    layout: Layout = Layout()  # unit, parsable, header, --tres given
    tres: list[str] = msgspec.field(default_factory=lambda: ["cpu"])  # --tres
    start: str | None = None  # start= as given
    end: str | None = None  # end= as given
    users: list[str] = []  # users=
    accounts: list[str] = []  # accounts=
    top: int = 10  # TopCount=
    group: bool = False  # TopUsage's ``group``: one entry per user, not per (user, account)
    help: str | None = None  # text to print instead (--help, --version)


def _prefixed(word: str, names: dict[str, int] | list[str], minimum: Callable[[str], int]) -> str | None:
    """The name ``word`` abbreviates (case-insensitive, at least the name's minimum length), or None."""
    lower = word.lower()
    for name in names:
        if len(lower) >= minimum(name) and name.startswith(lower):
            return name
    return None


def parse_time_format(text: str) -> TimeFormat:
    """``-t``: a time format name, abbreviated as Slurm allows."""
    lower = text.strip().lower()
    for name, value, minimum in _FORMATS:
        if len(lower) >= minimum and name.startswith(lower):
            return value
    raise CliError(f'invalid -t "{text}": use Seconds, Minutes, Hours, Percent, SecPer, MinPer or HourPer')


def parse_tres(items: Sequence[str]) -> list[str]:
    """``--tres``: cpu and/or gres/gpu, in the order given, each once."""
    tres: list[str] = []
    for item in items:
        name = item.lower()
        if name not in _TRES_NAMES:
            raise CliError(f'invalid --tres "{item}": Corral reports cpu and gres/gpu (e.g. --tres=gres/gpu)')
        if name not in tres:
            tres.append(name)
    if not tres:
        raise CliError('invalid --tres "": name cpu, gres/gpu or both')
    return tres


def parse_args(argv: Sequence[str]) -> SreportArgs:
    """Parse sreport's command line (no IO)."""
    args = OPTIONS.parse(argv)
    if args.given("help") or args.given("usage"):
        return SreportArgs(help=USAGE)
    if args.given("version"):
        return SreportArgs(help=version_text() + "\n")
    words = list(args.positionals)
    if len(words) < 2:
        raise CliError(
            "name a report: cluster utilization, cluster AccountUtilizationByUser or user TopUsage"
        )
    entity = _prefixed(words[0], _ENTITIES, _ENTITIES.__getitem__)
    names = [name for (ent, name) in _REPORTS if ent == entity]
    report = _prefixed(words[1], names, lambda name: _REPORTS[(entity or "", name)])
    if entity is None or report is None:
        raise CliError(
            f'unknown report "{" ".join(words[:2])}": use cluster utilization, '
            "cluster AccountUtilizationByUser or user TopUsage"
        )
    parsable = "P" if args.given("parsable2") else "p" if args.given("parsable") else None
    tres_given = args.given("tres")
    layout = Layout(
        time_format=parse_time_format(args.last("time-format") or "minutes"),
        parsable=parsable,
        header=not args.given("noheader"),
        tres_given=tres_given,
    )
    parsed = SreportArgs(
        report=(entity, report), layout=layout, tres=parse_tres(args.items("tres")) if tres_given else ["cpu"]
    )
    return _conditions(parsed, words[2:])


def _conditions(parsed: SreportArgs, words: Sequence[str]) -> SreportArgs:
    """The ``key=value`` conditions after the report's name."""
    changes: dict[str, object] = {}
    for word in words:
        key, equals, value = word.partition("=")
        key = key.lower()
        if word.lower() == "tree" and parsed.report == ("cluster", "accountutilizationbyuser"):
            changes["layout"] = msgspec.structs.replace(parsed.layout, tree=True)
            continue
        if word and "group".startswith(word.lower()) and parsed.report == ("user", "topusage"):
            changes["group"] = True
            continue
        if not equals or not value:
            raise CliError(f'unknown condition "{word}": use start=, end=, users=, accounts= or TopCount=')
        if key in ("start", "end"):
            changes[key] = value
        elif key in ("users", "user"):
            changes["users"] = [item for item in value.split(",") if item]
        elif key in ("accounts", "account", "acct"):
            changes["accounts"] = [item for item in value.split(",") if item]
        elif key == "topcount" and parsed.report == ("user", "topusage"):
            if not value.isdigit() or not 0 < int(value) <= 100_000:
                raise CliError(f'invalid TopCount "{value}": give a whole number from 1')
            changes["top"] = int(value)
        elif key == "format":
            raise CliError("sreport format= is not supported by Corral yet")
        else:
            raise CliError(f'unknown condition "{word}": use start=, end=, users=, accounts= or TopCount=')
    return msgspec.structs.replace(parsed, **changes)


def parse_report_time(text: str, option: str, now: float, tz: tzinfo | None = None) -> float:
    """A ``start=``/``end=`` time: sacct's forms, or ``MM/DD[/YY]`` (this year if no year is given)."""
    parts = text.strip().split("/")
    if 2 <= len(parts) <= 3 and all(part.isdigit() for part in parts):
        year = datetime.fromtimestamp(now, tz).year
        if len(parts) == 3:
            year = int(parts[2]) + (2000 if len(parts[2]) <= 2 else 0)
        try:
            moment = datetime(year, int(parts[0]), int(parts[1]), tzinfo=tz)
        except ValueError as exc:
            raise CliError(f'invalid {option} "{text}": {exc}') from None
        return moment.timestamp()
    return parse_time_point(text, option, now, tz)


def report_request(args: SreportArgs, now: float, tz: tzinfo | None = None) -> ReportRequest:
    """The ``report`` request: the window (default yesterday 00:00 to today 00:00), TRES and filters."""
    from corral.schemas.api import ReportRequest, ReportTres

    today = datetime.fromtimestamp(now, tz).replace(hour=0, minute=0, second=0, microsecond=0)
    start = (today - timedelta(days=1)).timestamp() if args.start is None else None
    end = today.timestamp() if args.end is None else None
    if args.start is not None:
        start = parse_report_time(args.start, "start", now, tz)
    if args.end is not None:
        end = parse_report_time(args.end, "end", now, tz)
    assert start is not None and end is not None
    if end <= start:
        raise CliError(f'the report\'s end ("{args.end or "today"}") must be after its start')
    tres = [name for name in args.tres if name in get_args(ReportTres)]
    return ReportRequest(start=start, end=end, tres=tres, users=args.users, accounts=args.accounts)  # type: ignore[arg-type]


def render(args: SreportArgs, reply: ReportReply) -> list[str]:
    """The output lines of the report ``args`` names."""
    if args.report == ("cluster", "utilization"):
        return cluster_utilization(reply, args.layout)
    if args.report == ("cluster", "accountutilizationbyuser"):
        return account_utilization_by_user(reply, args.layout)
    return top_usage(reply, args.layout, args.top, args.group)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sreport``."""
    return run_command(COMMAND, _sreport, argv)


def _sreport(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.help is not None:
        sys.stdout.write(args.help)
        return 0
    from corral.cli.client import find_cluster
    from corral.schemas.api import ReportReply

    request = report_request(args, time.time())
    reply = find_cluster().call("report", request, ReportReply)
    layout = msgspec.structs.replace(args.layout, proper_name=gecos_name)
    lines = render(msgspec.structs.replace(args, layout=layout), reply)
    sys.stdout.write("".join(line + "\n" for line in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
