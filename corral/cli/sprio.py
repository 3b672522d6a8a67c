"""``sprio``: the priority factors of pending jobs, from the scheduler's ``priority`` verb.

    sprio [-l] [-n] [-w] [-h] [-j IDS] [-u USERS] [-p PARTITIONS] [-o FORMAT]

Columns as Slurm's: JOBID PARTITION USER PRIORITY SITE AGE FAIRSHARE JOBSIZE PARTITION QOS NICE; ``-l``
adds ACCOUNT, ``-n`` shows the factors normalized (0..1) instead of weighted, ``-w`` prints the weights.
``-o`` letters: ``%i %r %u %o %Y`` and the factors ``%S %A %F %J %P %Q %N`` (weighted) or ``%a %f %j %p
%q`` (normalized). PRIORITY is what the job is scheduled with (0 while held, or the value an admin
set with ``scontrol update Priority=``); the factors are those of its computed priority (SITE is always
0: Corral has no site factor). Rendering is pure: ``render_priorities``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from corral.cli.errors import CliError, run_command
from corral.cli.fields import Layout, parse_layout, render_layout
from corral.cli.jobrefs import ids_of, job_label, parse_job_refs, split_job_list
from corral.cli.options import Option as Opt
from corral.cli.options import OptionTable, flag, unsupported, version_text

if TYPE_CHECKING:
    from corral.schemas.api import JobPriority, PriorityWeightsInfo

COMMAND = "sprio"
SHORT_FORMAT = "%.15i %9r %.8u %.10Y %.10S %.10A %.10F %.10J %.10P %.10Q %.6N"
LONG_FORMAT = "%.15i %9r %.8u %.10o %.10Y %.10S %.10A %.10F %.10J %.10P %.10Q %.6N"
NORM_FORMAT = "%.15i %9r %.8u %.10Y %.10S %.10a %.10f %.10j %.10p %.10q %.6N"

OPTIONS = OptionTable(
    [
        Opt("jobs", "j"),
        Opt("user", "u"),
        Opt("partition", "p"),
        Opt("format", "o"),
        flag("long", "l"),
        flag("norm", "n"),
        flag("weights", "w"),
        flag("noheader", "h"),
        flag("help"),
        flag("usage"),
        flag("version", "V"),
        *unsupported("clusters/M sort/S local sibling federation verbose/v"),
    ]
)

USAGE = """\
Usage: sprio [OPTIONS...]
  -j, --jobs=IDS         only these pending jobs     -u, --user=USERS      only these users
  -p, --partition=NAMES  only these partitions       -l, --long            also the account
  -n, --norm             normalized factors (0..1)   -w, --weights         the configured weights
  -o, --format=FORMAT    %i %r %u %o %Y, weighted %S %A %F %J %P %Q %N, normalized %a %f %j %p %q
  -h, --noheader         no header line
"""

_Getter = Callable[["JobPriority"], str]


def _weighted(value: float) -> str:
    return str(round(value))


def _norm(value: float, weight: int) -> str:
    return f"{value / weight if weight else 0.0:.7f}"


def fields(weights: PriorityWeightsInfo) -> dict[str, tuple[str, _Getter]]:
    """``-o`` letters: header and value (normalized factors need the weights)."""
    return {
        "i": ("JOBID", lambda j: job_label(j.job_id, j.array_job_id, j.array_task_id)),
        "r": ("PARTITION", lambda j: j.partition),
        "u": ("USER", lambda j: j.user),
        "o": ("ACCOUNT", lambda j: j.account),
        "Y": ("PRIORITY", lambda j: str(j.priority)),
        "S": ("SITE", lambda j: _weighted(j.factors.site)),
        "A": ("AGE", lambda j: _weighted(j.factors.age)),
        "F": ("FAIRSHARE", lambda j: _weighted(j.factors.fairshare)),
        "J": ("JOBSIZE", lambda j: _weighted(j.factors.job_size)),
        "P": ("PARTITION", lambda j: _weighted(j.factors.partition)),
        "Q": ("QOS", lambda j: _weighted(j.factors.qos)),
        "N": ("NICE", lambda j: _weighted(j.factors.nice)),
        "a": ("AGE", lambda j: _norm(j.factors.age, weights.age)),
        "f": ("FAIRSHARE", lambda j: _norm(j.factors.fairshare, weights.fairshare)),
        "j": ("JOBSIZE", lambda j: _norm(j.factors.job_size, weights.job_size)),
        "p": ("PARTITION", lambda j: _norm(j.factors.partition, weights.partition)),
        "q": ("QOS", lambda j: _norm(j.factors.qos, weights.qos)),
    }


#: The weight each factor letter shows in the ``-w`` row.
_WEIGHT_OF: dict[str, Callable[[PriorityWeightsInfo], int]] = {
    "S": lambda w: w.site,
    "A": lambda w: w.age,
    "a": lambda w: w.age,
    "F": lambda w: w.fairshare,
    "f": lambda w: w.fairshare,
    "J": lambda w: w.job_size,
    "j": lambda w: w.job_size,
    "P": lambda w: w.partition,
    "p": lambda w: w.partition,
    "Q": lambda w: w.qos,
    "q": lambda w: w.qos,
}


def layout_of(text: str | None, *, long: bool, norm: bool) -> Layout:
    """The output format: ``-o``, else the default of ``-l``/``-n``."""
    default = NORM_FORMAT if norm else LONG_FORMAT if long else SHORT_FORMAT
    letters = "irouYSAFJPQNafjpq"
    return parse_layout(text or default, "--format", letters, "bcBtTR")


def render_priorities(
    jobs: Sequence[JobPriority],
    weights: PriorityWeightsInfo,
    layout: Layout,
    *,
    header: bool,
    show_weights: bool,
) -> list[str]:
    """The output lines: the header, then a ``Weights`` row with ``-w``, then one row per job."""
    table = fields(weights)
    titles = [table[spec.key][0] for spec in layout.fields]
    rows = [[table[spec.key][1](job) for spec in layout.fields] for job in jobs]
    if show_weights:
        row = []
        for spec in layout.fields:
            weight = _WEIGHT_OF.get(spec.key)
            row.append("Weights" if spec.key == "i" else str(weight(weights)) if weight else "")
        rows.insert(0, row)
    return render_layout(layout, titles, rows, header=header)


def _sprio(argv: list[str]) -> int:
    args = OPTIONS.parse(argv)
    if args.given("help") or args.given("usage"):
        sys.stdout.write(USAGE)
        return 0
    if args.given("version"):
        print(version_text())
        return 0
    if args.positionals:
        raise CliError(f"unrecognized argument '{args.positionals[0]}'")
    layout = layout_of(args.last("format"), long=args.given("long"), norm=args.given("norm"))
    refs = parse_job_refs(split_job_list(args.all("jobs")), "--jobs")
    from corral.cli.client import find_cluster
    from corral.schemas.api import PriorityRequest

    request = PriorityRequest(job_ids=ids_of(refs), users=args.items("user"))
    reply = find_cluster().priorities(request)
    partitions = args.items("partition")
    jobs = [j for j in reply.jobs if not partitions or j.partition in partitions]
    lines = render_priorities(
        jobs, reply.weights, layout, header=not args.given("noheader"), show_weights=args.given("weights")
    )
    sys.stdout.write("".join(line.rstrip() + "\n" for line in lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sprio``."""
    return run_command(COMMAND, _sprio, argv)


if __name__ == "__main__":
    sys.exit(main())
