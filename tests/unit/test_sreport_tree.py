"""sreport cluster AccountUtilizationByUser over an account tree, as Slurm prints it.

The tree (the accounts' parents, as in the configuration; ``ml`` is not configured, so it hangs under root):

    root
    ├── bio          (zoe)
    │   └── bio-cell (amy)
    ├── chem         (no usage: not shown)
    ├── ml           (erin)
    └── physics      (no usage of its own)
        └── physics-hep (bob, carol)

Pure: ``summarise`` on hand-made runs, then the command's rendering at a fixed clock.
"""

from __future__ import annotations

import pytest

from corral.cli import sreport
from corral.cli.errors import CliError
from corral.schemas.api import AssocUsage, ReportReply, ReportRequest
from corral.services.accounting.report import Run, summarise
from corral.services.accounting.report_tree import account_rows, lineage

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
PARENTS = {"physics": "root", "physics-hep": "physics", "bio": "root", "bio-cell": "bio", "chem": "root"}
#: (account, user, GPUs, seconds) of one run each, inside the window.
JOBS = [
    ("physics-hep", "bob", 2, 100),
    ("physics-hep", "carol", 1, 50),
    ("physics-hep", "bob", 4, 10),
    ("bio", "zoe", 1, 30),
    ("bio-cell", "amy", 2, 20),
    ("ml", "erin", 8, 5),
]


def report(**filters: list[str]) -> ReportReply:
    runs = [Run(account=a, user=u, start=T0 + 10, end=T0 + 10 + s, cpus=2 * g, gpus=g) for a, u, g, s in JOBS]
    req = ReportRequest(start=T0, end=T0 + 3600, tres=["gres/gpu"], **filters)
    return summarise(req, runs, [], now=T0 + 7200, cluster="corral", parents=PARENTS)


def rows(reply: ReportReply) -> list[tuple[str, str, int, int]]:
    return [(r.account, r.user, r.depth, int(r.seconds[0])) for r in reply.accounts]


def test_rows_are_the_tree_depth_first_with_subtree_sums() -> None:
    assert rows(report()) == [
        ("root", "", 0, 240 + 50 + 30 + 40 + 40),
        ("bio", "", 1, 30 + 40),
        ("bio", "zoe", 2, 30),  # an account's users come before its sub-accounts
        ("bio-cell", "", 2, 40),
        ("bio-cell", "amy", 3, 40),
        ("ml", "", 1, 40),  # not configured: under root
        ("ml", "erin", 2, 40),
        ("physics", "", 1, 240 + 50),  # no usage of its own: the sum of its sub-account
        ("physics-hep", "", 2, 240 + 50),
        ("physics-hep", "bob", 3, 240),
        ("physics-hep", "carol", 3, 50),
    ]


def test_each_account_is_the_sum_of_what_hangs_beneath_it() -> None:
    reply = report()
    used = {(u.account, u.user): u.seconds for u in reply.usage}
    for row in reply.accounts:
        if not row.user:
            beneath = [s for (a, _), s in used.items() if row.account in lineage(a, PARENTS)]
            assert row.seconds == [sum(beneath)], row


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (
            {"accounts": ["physics"]},
            [
                ("physics", "", 0, 290),
                ("physics-hep", "", 1, 290),
                ("physics-hep", "bob", 2, 240),
                ("physics-hep", "carol", 2, 50),
            ],
        ),
        ({"users": ["bob", "zoe"]}, [("physics-hep", "bob", 0, 240), ("bio", "zoe", 0, 30)]),
        ({"accounts": ["bio"], "users": ["amy"]}, [("bio-cell", "amy", 0, 40)]),
        ({"accounts": ["chem"]}, []),
    ],
    ids=["account-subtree", "users-only", "both", "unused-account"],
)
def test_filters_show_what_slurm_shows(
    filters: dict[str, list[str]], expected: list[tuple[str, str, int, int]]
) -> None:
    assert rows(report(**filters)) == expected


def test_rows_carry_every_tres_asked() -> None:
    assert account_rows({("a", "u"): [3.0, 6.0]}, {}) == [
        AssocUsage(account="root", seconds=[3.0, 6.0]),
        AssocUsage(account="a", depth=1, seconds=[3.0, 6.0]),
        AssocUsage(account="a", user="u", depth=2, seconds=[3.0, 6.0]),
    ]
    reply = summarise(
        ReportRequest(start=T0, end=T0 + 100, tres=["cpu", "gres/gpu"]),
        [Run(account="a", user="u", start=T0, end=T0 + 10, cpus=4, gpus=1)],
        [],
        now=T0 + 100,
    )
    argv = ["-P", "-n", "-t", "seconds", "--tres=cpu,gres/gpu", "cluster", "AccountUtilizationByUser"]
    # One line per TRES of each association, in the order asked.
    assert sreport.render(sreport.parse_args(argv), reply)[:2] == ["|root|||cpu|40", "|root|||gres/gpu|10"]


def lines(argv: list[str], reply: ReportReply | None = None) -> list[str]:
    return sreport.render(sreport.parse_args(argv), reply or report(accounts=["physics", "ml"]))


def test_parsable_rows_in_slurms_order() -> None:
    argv = ["-P", "-t", "seconds", "--tres=gres/gpu", "cluster", "AccountUtilizationByUser"]
    assert lines(argv)[4:] == [
        "Cluster|Account|Login|Proper Name|TRES Name|Used",
        "corral|ml|||gres/gpu|40",
        "corral|ml|erin||gres/gpu|40",
        "corral|physics|||gres/gpu|290",
        "corral|physics-hep|||gres/gpu|290",
        "corral|physics-hep|bob||gres/gpu|240",
        "corral|physics-hep|carol||gres/gpu|50",
    ]
    assert lines(["-p", "-n", "-t", "seconds", "cluster", "accountutil"], report())[:2] == [
        "corral|root|||400|0|",
        "corral|bio|||70|0|",
    ]


def test_tree_indents_accounts_by_depth() -> None:
    argv = ["-P", "-n", "-t", "seconds", "cluster", "AccountUtilizationByUser", "tree"]
    assert [line.split("|")[1] for line in lines(argv, report())] == [
        "root",
        " bio",
        "  bio",
        "  bio-cell",
        "   bio-cell",
        " ml",
        "  ml",
        " physics",
        "  physics-hep",
        "   physics-hep",
        "   physics-hep",
    ]
    fixed = lines(["-t", "seconds", "cluster", "AccountUtilizationByUser", "Tree"], report())
    assert fixed[4:8] == [
        "  Cluster Account                  Login     Proper Name       Used     Energy ",
        "--------- -------------------- --------- --------------- ---------- ---------- ",
        "   corral root                                                  400          0 ",
        "   corral  bio                                                   70          0 ",
    ]
    assert fixed[8] == "   corral   bio                      zoe                         30          0 "


def test_default_account_column_is_right_justified_without_indent() -> None:
    out = lines(["-t", "seconds", "cluster", "AccountUtilizationByUser"], report())
    assert out[4:8] == [
        "  Cluster         Account     Login     Proper Name       Used     Energy ",
        "--------- --------------- --------- --------------- ---------- ---------- ",
        "   corral            root                                  400          0 ",
        "   corral             bio                                   70          0 ",
    ]


def test_tree_belongs_to_account_utilization_only() -> None:
    with pytest.raises(CliError, match='unknown condition "tree"'):
        sreport.parse_args(["cluster", "utilization", "tree"])


def test_top_usage_ranks_user_associations_unless_grouped() -> None:
    runs = [
        Run(account=a, user=u, start=T0, end=T0 + s, cpus=1, gpus=1)
        for a, u, s in [("ml", "alice", 100), ("cv", "alice", 50), ("ml", "bob", 120)]
    ]
    reply = summarise(ReportRequest(start=T0, end=T0 + 3600, tres=["gres/gpu"]), runs, [], now=T0 + 3600)
    argv = ["-P", "-n", "-t", "seconds", "user", "TopUsage"]
    # Slurm's default: one entry per (user, account).
    assert sreport.render(sreport.parse_args(argv), reply) == [
        "|bob||ml|120|0",
        "|alice||ml|100|0",
        "|alice||cv|50|0",
    ]
    assert sreport.render(sreport.parse_args([*argv, "TopCount=1"]), reply) == ["|bob||ml|120|0"]
    # group: one per user, its accounts joined by ", ".
    assert sreport.render(sreport.parse_args([*argv, "group"]), reply) == [
        "|alice||cv, ml|150|0",
        "|bob||ml|120|0",
    ]
    assert sreport.parse_args(["user", "top", "gr"]).group
