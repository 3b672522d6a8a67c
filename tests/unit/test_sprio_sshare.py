"""sprio and sshare: the scheduler views of priority factors and of the fair-share tree, rendered."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from builders import Log, allocated, cluster, exited, job, policy, submitted

from corral.cli.sprio import layout_of, render_priorities
from corral.cli.sshare import render_shares
from corral.libs.core.fair_share import Account, UserAssoc, charge
from corral.libs.core.plan import plan
from corral.libs.core.priority import PriorityWeights, Ranking, queue_order
from corral.libs.core.state import Job, State
from corral.schemas import api
from corral.schemas import events as ev
from corral.schemas.codec import MAX_REPLY_BYTES
from corral.services.scheduler import priority_views
from corral.services.scheduler.priority_views import priority_reply, shares_reply

pytestmark = pytest.mark.unit

POLICY = dataclasses.replace(
    policy(),
    weights=PriorityWeights(age=1000, fairshare=10_000, job_size=100, max_age_s=1000.0),
    accounts=(Account("ml", "root", 2), Account("cv", "root", 1)),
    associations=(UserAssoc("alice", "ml"), UserAssoc("bob", "cv")),
)


def busy_log() -> Log:
    """One node: alice ran 8 GPUs for 100 s (usage), then a full job runs; three jobs wait."""
    log = Log(*cluster(nodes=1, gpus=8))
    log.add(submitted(1, job(gpus=8, nodes=1, account="ml"), user="alice"))
    log.add(allocated(1, {"gpu01": list(range(8))}))
    log.add(exited(1, "gpu01"), step=100.0)
    for decision in plan(log.state, log.state.now, POLICY).decisions:
        log.add(decision, step=0.0)
    log.add(submitted(2, job(gpus=8, nodes=1, account="ml"), user="alice"))
    log.add(allocated(2, {"gpu01": list(range(8))}))
    log.add(submitted(3, job(gpus=4, nodes=1, account="ml"), user="alice"), step=100.0)
    log.add(submitted(4, job(gpus=8, nodes=1, account="cv"), user="bob"), step=100.0)
    log.add(submitted(5, job(gpus=8, nodes=1, account="cv"), user="bob"), step=100.0)
    return log


def test_sprio_rows_are_the_pending_jobs_in_queue_order_with_their_weighted_factors() -> None:
    log = busy_log()
    reply = priority_reply(log.state, POLICY, api.PriorityRequest(), log.state.now)
    assert [j.job_id for j in reply.jobs] == [3, 4, 5]  # by id, one page
    ranked = sorted(reply.jobs, key=api.JobPriority.queue_key)
    assert [j.job_id for j in ranked] == [4, 5, 3]  # bob has no usage: fair share 1.0 against 0.5
    by_id = {j.job_id: j for j in reply.jobs}
    assert by_id[3].factors == api.PriorityFactors(age=200.0, fairshare=5000.0, job_size=50.0)
    assert by_id[4].factors.fairshare == 10_000.0 and by_id[4].factors.job_size == 100.0
    for row in reply.jobs:
        f = row.factors
        assert row.priority == int(f.site + f.age + f.fairshare + f.job_size + f.partition + f.qos - f.nice)
        assert (f.site, f.qos, f.nice) == (0.0, 0.0, 0.0)
    assert reply.weights == api.PriorityWeightsInfo(age=1000, fairshare=10_000, job_size=100, partition=0)
    only = priority_reply(log.state, POLICY, api.PriorityRequest(users=["alice"]), log.state.now)
    assert [j.job_id for j in only.jobs] == [3]


def in_pages(state: State, request: api.PriorityRequest) -> list[api.PriorityReply]:
    """Every page of an sprio request, each asked after the last job of the one before."""
    pages = []
    while True:
        reply = priority_reply(state, POLICY, request, state.now)
        pages.append(reply)
        if not reply.more:
            return pages
        request = msgspec.structs.replace(request, after_job_id=reply.jobs[-1].job_id)


def test_sprio_of_a_queue_of_thousands_comes_in_pages_that_each_fit_a_message() -> None:
    # sprio's reply held every pending job in queue order, ~244 B of JSON each: 18,000 were ~4.4 MB, over
    # the decoders' 4 MiB (and ~34,000 over NATS's 8 MiB max_payload), and sprio failed. The verb now answers
    # by job id, a page under MAX_REPLY_BYTES at a time; each row carries what orders the queue, so the pages
    # sorted by JobPriority.queue_key are the queue's order.
    log = busy_log()
    ids = list(range(18_005, 5, -1))  # submitted in the reverse order of their ids
    for job_id in ids:
        user, account = ("alice", "ml") if job_id % 3 else ("bob", "cv")
        log.add(submitted(job_id, job(gpus=1 + job_id % 8, nodes=1, account=account), user=user))
    log.add(ev.JobHeld(job_id=6, by="bob"))
    log.add(ev.JobUpdateRequested(job_id=7, user="root", admin=True, priority=99_999))
    log.add(ev.JobUpdated(job_id=7, by="root", time_limit_s=None, partition=None, priority=99_999))
    pages = in_pages(log.state, api.PriorityRequest())
    assert len(pages) >= 2
    assert all(len(msgspec.json.encode(p)) <= MAX_REPLY_BYTES + 256 for p in pages)
    assert all(p.more for p in pages[:-1]) and not pages[-1].more
    rows = [row for p in pages for row in p.jobs]
    assert [r.job_id for r in rows] == sorted([3, 4, 5, *ids])
    now = log.state.now
    pending = [log.state.jobs[r.job_id] for r in rows]
    order = [job.job_id for job, _ in queue_order(log.state, now, POLICY, pending)]
    assert [r.job_id for r in sorted(rows, key=api.JobPriority.queue_key)] == order
    assert order[0] == 7 and rows[3].job_id == 6 and rows[3].priority == 0  # held: shown 0, ranked by value
    # A user's pages hold only theirs ...
    # ... and the same factors as in everyone's: alice's fair share is ranked against bob's.
    alices = [r for p in in_pages(log.state, api.PriorityRequest(users=["alice"])) for r in p.jobs]
    assert alices == [r for r in rows if r.user == "alice"]
    assert len(alices) == 1 + len([i for i in ids if i % 3])


def test_sprio_shows_an_admin_set_priority_and_zero_for_a_held_job() -> None:
    log = busy_log()
    log.add(ev.JobUpdateRequested(job_id=3, user="root", admin=True, priority=99_999))
    log.add(ev.JobUpdated(job_id=3, by="root", time_limit_s=None, partition=None, priority=99_999))
    log.add(ev.JobHeld(job_id=5, by="bob"))
    reply = priority_reply(log.state, POLICY, api.PriorityRequest(job_ids=[3, 5]), log.state.now)
    rows = {j.job_id: j for j in reply.jobs}
    assert [j.job_id for j in reply.jobs] == [3, 5]
    assert (rows[3].priority, rows[3].admin_set) == (99_999, True)
    assert rows[3].factors.fairshare == 5000.0  # the computed factors are still shown
    assert (rows[5].priority, rows[5].admin_set) == (0, False)


@pytest.mark.parametrize(
    ("request_", "caller", "wanted"),
    [
        (api.SharesRequest(), "alice", [("root", ""), ("ml", ""), ("ml", "alice")]),
        (
            api.SharesRequest(all_users=True),
            "alice",
            [("root", ""), ("cv", ""), ("cv", "bob"), ("ml", ""), ("ml", "alice")],
        ),
        (api.SharesRequest(users=["bob"]), "alice", [("root", ""), ("cv", ""), ("cv", "bob")]),
        (api.SharesRequest(accounts=["cv"], all_users=True), "x", [("root", ""), ("cv", ""), ("cv", "bob")]),
        (api.SharesRequest(), "nobody", [("root", "")]),
    ],
    ids=["caller", "all", "-u", "-A", "unknown caller"],
)
def test_sshare_selects_associations_and_the_accounts_above_them(
    request_: api.SharesRequest, caller: str, wanted: list[tuple[str, str]]
) -> None:
    log = busy_log()
    rows = shares_reply(log.state, POLICY, request_, caller, log.state.now).rows
    assert [(r.account, r.user) for r in rows] == wanted


def test_sshare_numbers_come_from_the_fair_share_core() -> None:
    log = busy_log()
    rows = shares_reply(log.state, POLICY, api.SharesRequest(all_users=True), "x", log.state.now).rows
    by = {(r.account, r.user): r for r in rows}
    ml, alice, cv, bob = by["ml", ""], by["ml", "alice"], by["cv", ""], by["cv", "bob"]
    assert (ml.raw_shares, ml.norm_shares, cv.norm_shares) == (2, pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert alice.raw_usage == pytest.approx(800.0, rel=1e-3)  # 8 GPUs x 100 s, barely decayed
    assert (ml.effective_usage, alice.effective_usage, cv.effective_usage) == (1.0, 1.0, 0.0)
    assert (alice.fairshare, bob.fairshare, ml.fairshare) == (0.5, 1.0, None)
    assert bob.level_fs is None and ml.level_fs == pytest.approx(2 / 3)


def test_render_sprio_default_weights_and_normalized() -> None:
    weights = api.PriorityWeightsInfo(age=1000, fairshare=10_000, job_size=100, partition=0)
    row = api.JobPriority(
        job_id=7,
        user="alice",
        account="ml",
        partition="gpu",
        priority=5350,
        factors=api.PriorityFactors(age=300.0, fairshare=5000.0, job_size=50.0),
    )
    lines = render_priorities(
        [row], weights, layout_of(None, long=False, norm=False), header=True, show_weights=True
    )
    assert [line.split() for line in lines] == [
        [
            "JOBID",
            "PARTITION",
            "USER",
            "PRIORITY",
            "SITE",
            "AGE",
            "FAIRSHARE",
            "JOBSIZE",
            "PARTITION",
            "QOS",
            "NICE",
        ],
        ["Weights", "0", "1000", "10000", "100", "0", "0"],
        ["7", "gpu", "alice", "5350", "0", "300", "5000", "50", "0", "0", "0"],
    ]
    norm = render_priorities(
        [row], weights, layout_of(None, long=False, norm=True), header=False, show_weights=False
    )
    assert norm[0].split()[4:9] == ["0", "0.3000000", "0.5000000", "0.5000000", "0.0000000"]
    assert render_priorities(
        [row], weights, layout_of("%i|%o|%Y", long=False, norm=False), header=False, show_weights=False
    ) == ["7|ml|5350"]


def test_render_sshare_indents_accounts_and_parsable() -> None:
    rows = [
        api.ShareInfo(
            account="root",
            user="",
            depth=0,
            raw_shares=1,
            norm_shares=1.0,
            raw_usage=800.0,
            effective_usage=1.0,
            fairshare=None,
        ),
        api.ShareInfo(
            account="ml",
            user="",
            depth=1,
            raw_shares=2,
            norm_shares=2 / 3,
            raw_usage=800.0,
            effective_usage=1.0,
            fairshare=None,
            level_fs=2 / 3,
        ),
        api.ShareInfo(
            account="ml",
            user="alice",
            depth=2,
            raw_shares=1,
            norm_shares=1.0,
            raw_usage=800.0,
            effective_usage=1.0,
            fairshare=0.5,
            level_fs=1.0,
        ),
    ]
    lines = render_shares(rows, long=False, header=True, parsable=False)
    assert lines[0].split() == [
        "Account",
        "User",
        "RawShares",
        "NormShares",
        "RawUsage",
        "EffectvUsage",
        "FairShare",
    ]
    assert lines[2].startswith("root ") and lines[3].startswith(" ml ") and lines[4].startswith(" ml ")
    assert lines[4].split() == ["ml", "alice", "1", "1.000000", "800", "1.000000", "0.500000"]
    assert render_shares(rows[1:], long=True, header=False, parsable=True) == [
        " ml||2|0.666667|800|1.000000||0.666667|",
        " ml|alice|1|1.000000|800|1.000000|0.500000|1.000000|",
    ]


def share_key(row: api.ShareInfo) -> str:
    """A row's place in the tree: its account, or account/user."""
    return f"{row.account}/{row.user}" if row.user else row.account


def test_sshare_of_thousands_of_associations_comes_in_pages_that_each_fit_a_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # ``sshare -a`` of a site with 1,000 accounts of 20 users was one reply of ~21,000 rows (3.3 MB of JSON:
    # over the decoders' 4 MiB past ~27,000 rows), built in seconds on every scheduler's loop. It now comes
    # in pages in the tree's order, each from the row after those before (``start``), and each computes only
    # the rows it shows.
    many = dataclasses.replace(
        POLICY,
        accounts=tuple(Account(f"acct{a:04d}", "root", 1 + a % 3) for a in range(1000)),
        associations=tuple(UserAssoc(f"u{a}_{k}", f"acct{a:04d}") for a in range(1000) for k in range(20)),
    )
    log = busy_log()
    for a in range(0, 1000, 7):
        charge(log.state.usage, f"acct{a:04d}/u{a}_3", 100.0 + a, log.state.now, 7 * 86400.0)
    request = api.SharesRequest(all_users=True)
    pages = []
    while True:
        out = shares_reply(log.state, many, request, "x", log.state.now)
        assert len(msgspec.json.encode(out)) <= MAX_REPLY_BYTES + 256
        pages.append(out)
        if not out.more:
            break
        request = msgspec.structs.replace(request, start=request.start + len(out.rows))
    assert len(pages) >= 2
    monkeypatch.setattr(priority_views, "MAX_REPLY_BYTES", 10**9)
    whole = shares_reply(log.state, many, api.SharesRequest(all_users=True), "x", log.state.now)
    assert [row for p in pages for row in p.rows] == whole.rows and not whole.more
    assert len(whole.rows) == 1 + 1000 + 20_000 + 2 * 2  # root, the accounts, their users; alice's, bob's
    # The caller's own rows, and those of -A, are the same rows as in the whole tree.
    own = shares_reply(log.state, many, api.SharesRequest(), "u7_3", log.state.now).rows
    assert [share_key(r) for r in own] == ["root", "acct0007", "acct0007/u7_3"]
    assert own == [r for r in whole.rows if share_key(r) in {"root", "acct0007", "acct0007/u7_3"}]
    beneath = shares_reply(
        log.state, many, api.SharesRequest(accounts=["acct0014"], all_users=True), "x", 0.0
    )
    users = sorted(f"acct0014/u14_{k}" for k in range(20))  # children by name
    assert [share_key(r) for r in beneath.rows] == ["root", "acct0014", *users]


def test_each_sprio_page_computes_the_factors_of_its_own_rows_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every page computed every pending job's factors and the queue's order, to show its ~10,000 rows: 2.3 s
    # for 50,000 pending jobs read in 5 pages (bench/sprio_pages.py). The fair-share tree is still that of
    # every pending job's users, so the rows are those of one page of everyone's.
    log = busy_log()
    for job_id in range(6, 3006):
        user, account = ("alice", "ml") if job_id % 3 else ("bob", "cv")
        log.add(submitted(job_id, job(gpus=1, nodes=1, account=account), user=user))
    whole = priority_reply(log.state, POLICY, api.PriorityRequest(), log.state.now)
    assert not whole.more and len(whole.jobs) == 3003
    computed: list[int] = []
    factors = Ranking.factors

    def counted(self: Ranking, job: Job) -> api.PriorityFactors:
        computed.append(job.job_id)
        return factors(self, job)

    monkeypatch.setattr(Ranking, "factors", counted)
    monkeypatch.setattr(priority_views, "MAX_REPLY_BYTES", 50_000)
    pages = in_pages(log.state, api.PriorityRequest())
    rows = [row for p in pages for row in p.jobs]
    assert len(pages) >= 3 and rows == whole.jobs
    # Each page's rows, and the one row that did not fit in each page but the last.
    assert len(computed) == len(rows) + len(pages) - 1
