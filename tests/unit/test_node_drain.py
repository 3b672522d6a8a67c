"""Admin node drain and resume: scontrol parsing, the gateway's checks, the fold, placement, views, roles."""

from __future__ import annotations

import dataclasses
from datetime import UTC

import msgspec
import pytest
from builders import T0, Log, allocated, cluster, cluster_config, exited, job, policy, registered, submitted

from corral.cli import scontrol_nodes, sinfo
from corral.cli.errors import CliError
from corral.libs.core.orders import orders
from corral.libs.core.placement import free_capacity
from corral.libs.core.plan import plan
from corral.libs.core.state import AdminDrain, State, drain_reason, drained
from corral.libs.infra import roles
from corral.libs.runtime.errors import InvalidInput
from corral.libs.slurm.errors import FormatError
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.services.accounting.projection import convert
from corral.services.gateway.nodes import NEED_REASON, check_update, resume_problem
from corral.services.scheduler.views import node_state, nodes_reply

pytestmark = pytest.mark.unit

CONFIG = cluster_config(nodes=2, gpus=8)


def drain(node: str, reason: str = "bad fan", by: str = "root") -> ev.NodeDrained:
    return ev.NodeDrained(node=node, reason=reason, by=by)


def resume(node: str, by: str = "root") -> ev.NodeResumed:
    return ev.NodeResumed(node=node, by=by)


def mismatch(node: str) -> ev.NodeRegistered:
    """A registration whose GPU count does not match the configuration."""
    return msgspec.structs.replace(registered(node), drain_reason="gres/gpu count reported lower")


# --- scontrol update NodeName= ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "wanted"),
    [
        (
            ["NodeName=gpu02", "State=DRAIN", "Reason=bad fan"],
            api.NodeUpdateRequest(nodes=["gpu02"], state="DRAIN", reason="bad fan"),
        ),
        (
            ["nodename=gpu[01-02]", "state=drain", "reason=  swap PSU "],
            api.NodeUpdateRequest(nodes=["gpu01", "gpu02"], state="DRAIN", reason="swap PSU"),
        ),
        (["NODENAME=gpu02", "STATE=Resume"], api.NodeUpdateRequest(nodes=["gpu02"], state="RESUME")),
        (["State=UNDRAIN", "Node=gpu02"], api.NodeUpdateRequest(nodes=["gpu02"], state="RESUME")),
        (
            ["NodeName=gpu02", "State=RESUME", "Reason=fixed"],
            api.NodeUpdateRequest(nodes=["gpu02"], state="RESUME", reason="fixed"),
        ),
        (
            ["NodeName=gpu02", "State=down", "Reason=PSU failed"],
            api.NodeUpdateRequest(nodes=["gpu02"], state="DOWN", reason="PSU failed"),
        ),
    ],
    ids=["drain", "any-case-hostlist", "resume", "undrain-key-order", "resume-with-reason", "down"],
)
def test_node_update_request(words: list[str], wanted: api.NodeUpdateRequest) -> None:
    assert scontrol_nodes.node_update_request(words) == wanted


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["NodeName=gpu02", "State=DRAIN"], NEED_REASON),
        (["NodeName=gpu02", "State=DRAIN", "Reason=  "], NEED_REASON),
        (["NodeName=gpu02", "State=DOWN"], NEED_REASON),
        (["NodeName=gpu02", "State=IDLE"], "State=IDLE is not supported by Corral yet"),
        (["NodeName=gpu02", "State=sleepy"], "State=sleepy: use DRAIN, DOWN, RESUME or UNDRAIN"),
        (["NodeName=gpu02"], "needs State=DRAIN Reason=TEXT or State=RESUME"),
        (["NodeName=", "State=RESUME"], "scontrol update needs NodeName=LIST"),
        (["NodeName=gpu02", "Weight=5"], "changing Weight of a node is not supported by Corral yet"),
        (["NodeName=gpu02", "drain"], "scontrol update drain: use KEY=VALUE"),
    ],
    ids=["no-reason", "blank-reason", "down-no-reason", "idle", "junk-state", "no-state",
         "no-nodes", "other-key", "not-key-value"],
)  # fmt: skip
def test_node_update_refusals(words: list[str], message: str) -> None:
    with pytest.raises(CliError) as info:
        scontrol_nodes.node_update_request(words)
    assert message in info.value.message


def test_a_malformed_hostlist_is_refused_naming_the_key() -> None:
    with pytest.raises(FormatError, match="NodeName"):
        scontrol_nodes.node_update_request(["NodeName=gpu[01-", "State=RESUME"])


# --- the gateway's checks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "field", "message"),
    [
        (api.NodeUpdateRequest(nodes=["gpu09"], state="DRAIN", reason="x"), "NodeName", "gpu09"),
        (api.NodeUpdateRequest(nodes=[], state="RESUME"), "NodeName", "Invalid node name specified"),
        (api.NodeUpdateRequest(nodes=["gpu01"], state="DRAIN"), "Reason", NEED_REASON),
        (api.NodeUpdateRequest(nodes=["gpu01"], state="DRAIN", reason="a\nb"), "Reason", "one line"),
        (api.NodeUpdateRequest(nodes=["gpu01"], state="DRAIN", reason="x" * 300), "Reason", "256"),
    ],
    ids=["unknown-node", "no-node", "no-reason", "two-lines", "too-long"],
)
def test_the_gateway_refuses_what_can_never_be_done(
    req: api.NodeUpdateRequest, field: str, message: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        check_update(req, CONFIG)
    assert info.value.field == field and message in str(info.value)


def test_the_gateway_accepts_known_nodes_with_a_reason() -> None:
    check_update(api.NodeUpdateRequest(nodes=["gpu01", "gpu02"], state="DRAIN", reason="x"), CONFIG)
    check_update(api.NodeUpdateRequest(nodes=["gpu01"], state="RESUME"), CONFIG)


def _entry(seq: int, body: ev.Event) -> object:
    from corral.libs.runtime.bus import LogEntry

    return LogEntry(seq=seq, subject=subjects.event_subject(body), envelope=ev.Envelope(
        meta=ev.Meta(event_id=str(seq), occurred_at=T0, actor="test"), body=body))  # fmt: skip


@pytest.mark.parametrize(
    ("drained_at", "resumed_at", "registered", "may"),
    [
        (None, None, (1, registered("gpu01")), False),
        (5, None, (1, registered("gpu01")), True),
        (5, 6, (1, registered("gpu01")), False),
        (5, 6, (7, mismatch("gpu01")), True),
        (None, 6, (3, mismatch("gpu01")), False),
        (8, 6, (7, registered("gpu01")), True),
    ],
    ids=["never-drained", "admin-drained", "resumed", "mismatch-after-resume", "mismatch-before-resume",
         "drained-again"],
)  # fmt: skip
def test_resume_needs_a_drained_node(
    drained_at: int | None, resumed_at: int | None, registered: tuple[int, ev.NodeRegistered], may: bool
) -> None:
    entries = [
        _entry(drained_at, drain("gpu01")) if drained_at else None,
        _entry(resumed_at, resume("gpu01")) if resumed_at else None,
        _entry(*registered),
    ]
    problem = resume_problem("gpu01", *entries)  # type: ignore[arg-type]
    assert (problem is None) == may, problem
    if not may:
        assert problem == (
            "Invalid node state specified: gpu01 is not drained nor downed by an admin "
            "(RESUME ends a DRAIN or DOWN)"
        )


@pytest.mark.parametrize(
    ("down", "resumed_at", "may"),
    [
        ((5, ev.NodeDown(node="gpu01", reason="PSU", by="root")), None, True),
        ((5, ev.NodeDown(node="gpu01", reason="Not responding")), None, False),
        ((5, ev.NodeDown(node="gpu01", reason="PSU", by="root")), 6, False),
    ],
    ids=["downed-by-an-admin", "not-responding", "resumed-since"],
)
def test_resume_ends_an_admins_down(down: tuple[int, ev.NodeDown], resumed_at: int | None, may: bool) -> None:
    resumed = _entry(resumed_at, resume("gpu01")) if resumed_at else None
    problem = resume_problem("gpu01", None, resumed, _entry(1, registered("gpu01")), _entry(*down))  # type: ignore[arg-type]
    assert (problem is None) == may, problem


# --- the fold -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bodies", "admin", "registration"),
    [
        ([drain("gpu02")], "bad fan", ""),
        ([drain("gpu02"), drain("gpu02", "new reason")], "new reason", ""),
        ([drain("gpu02"), registered("gpu02")], "bad fan", ""),
        ([drain("gpu02"), mismatch("gpu02"), registered("gpu02")], "bad fan", ""),
        ([mismatch("gpu02"), drain("gpu02")], "bad fan", "gres/gpu count reported lower"),
        ([drain("gpu02"), resume("gpu02")], "", ""),
        ([mismatch("gpu02"), resume("gpu02")], "", ""),
        ([mismatch("gpu02"), resume("gpu02"), mismatch("gpu02")], "", "gres/gpu count reported lower"),
        ([drain("gpu02"), ev.NodeDown(node="gpu02", reason="Not responding"), ev.NodeUp(node="gpu02")],
         "bad fan", ""),
        ([drain("gpu09"), resume("gpu02")], "", ""),
    ],
    ids=["drained", "drained-again-new-reason", "survives-reregistration", "survives-mismatch-and-clean",
         "both-drains", "resumed", "resume-clears-mismatch", "mismatch-drains-again", "survives-down-up",
         "unknown-node-elsewhere"],
)  # fmt: skip
def test_fold_of_drains(bodies: list[ev.Event], admin: str, registration: str) -> None:
    log = Log(*cluster(nodes=2))
    state = log.add(*bodies)
    node = state.nodes["gpu02"]
    assert (node.admin_drain.reason if node.admin_drain else "", node.drain) == (admin, registration)
    assert drained(node) == bool(admin or registration)
    assert drain_reason(node) == (admin or registration)


def test_the_fold_records_who_drained_and_when() -> None:
    log = Log(*cluster(nodes=2))
    state = log.add(drain("gpu02", by="ops"))
    assert state.nodes["gpu02"].admin_drain == AdminDrain(reason="bad fan", by="ops", at=log.at)


def test_a_node_drained_before_it_registers_registers_drained() -> None:
    log = Log()
    state = log.add(drain("gpu01"))
    assert "gpu01" not in state.nodes and state.early_drains["gpu01"].reason == "bad fan"
    state = log.add(registered("gpu01"))
    assert drain_reason(state.nodes["gpu01"]) == "bad fan" and state.early_drains == {}
    # Resumed before registering: nothing is left of it.
    other = Log()
    other.add(drain("gpu01"), resume("gpu01"))
    assert other.state.early_drains == {}
    assert not drained(other.add(registered("gpu01")).nodes["gpu01"])


def test_intents_change_nothing_until_health_answers() -> None:
    log = Log(*cluster(nodes=2))
    before = msgspec.json.encode(log.state.nodes)
    log.add(ev.NodeDrainRequested(node="gpu02", user="root", reason="x"))
    log.add(ev.NodeResumeRequested(node="gpu02", user="root"))
    assert msgspec.json.encode(log.state.nodes) == before


def test_replay_gives_the_live_state() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, gpus=2)), allocated(1, {"gpu02": [0, 1]}), drain("gpu02"))
    log.add(mismatch("gpu02"), resume("gpu02"), drain("gpu01", "later"))
    replayed = State()
    from corral.libs.core.fold import fold

    fold(log.entries, replayed)
    assert msgspec.json.encode(replayed) == msgspec.json.encode(log.state)


# --- placement and pending reasons -------------------------------------------------------------------


def test_a_drained_node_gets_no_new_job_and_its_running_job_finishes() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, gpus=8)), allocated(1, {"gpu02": list(range(8))}))
    log.add(drain("gpu02"))
    assert sorted(free_capacity(log.state.nodes)) == ["gpu01"]
    assert node_state(log.state.nodes["gpu02"]) == "draining"
    # Two new single-node jobs: one starts on gpu01, the other pends for Resources, never on gpu02.
    log.add(submitted(2, job(nodes=1, gpus=8)), submitted(3, job(nodes=1, gpus=8)))
    out = plan(log.state, log.at, policy())
    assert [(d.job_id, [a.node for a in d.allocations]) for d in out.decisions] == [(2, ["gpu01"])]
    assert out.reasons[3] == "Resources"
    # Job 1 ends normally on the draining node, which is then drained (still nothing placed there).
    log.add(exited(1, "gpu02"), ev.JobCompleted(job_id=1, attempt=0))
    assert log.state.jobs[1].state == "COMPLETED"
    assert node_state(log.state.nodes["gpu02"]) == "drained"
    assert sorted(free_capacity(log.state.nodes)) == ["gpu01"]
    # Resumed: job 3 goes to gpu02.
    log.add(allocated(2, {"gpu01": list(range(8))}), resume("gpu02"))
    out = plan(log.state, log.at, policy())
    assert [(d.job_id, [a.node for a in d.allocations]) for d in out.decisions] == [(3, ["gpu02"])]


@pytest.mark.parametrize(
    ("nodelist", "before", "reason"),
    [
        (["gpu02"], [drain("gpu02")], "ReqNodeNotAvail, UnavailableNodes:gpu02"),
        (["gpu01", "gpu02"], [drain("gpu01"), drain("gpu02")],
         "ReqNodeNotAvail, UnavailableNodes:gpu[01-02]"),
        (["gpu02"], [ev.NodeDown(node="gpu02", reason="Not responding")],
         "ReqNodeNotAvail, UnavailableNodes:gpu02"),
        ([], [drain("gpu01"), drain("gpu02")], "Resources"),
    ],
    ids=["w-drained", "w-both-drained", "w-down", "no-w-all-drained"],
)  # fmt: skip
def test_pending_reason_of_a_job_that_only_fits_on_drained_nodes(
    nodelist: list[str], before: list[ev.Event], reason: str
) -> None:
    log = Log(*cluster(nodes=2))
    log.add(*before, submitted(1, job(nodes=len(nodelist) or 1, gpus=8, nodelist=nodelist)))
    out = plan(log.state, log.at, policy())
    assert out.decisions == [] and out.reason_text(1) == reason


def test_a_job_waiting_for_a_drained_node_blocks_nobody() -> None:
    log = Log(*cluster(nodes=2))
    log.add(drain("gpu02"), submitted(1, job(nodes=1, gpus=8, nodelist=["gpu02"])))
    log.add(submitted(2, job(nodes=1, gpus=8)))
    fifo = dataclasses.replace(policy(), backfill="fifo")
    out = plan(log.state, log.at, fifo)
    assert [d.job_id for d in out.decisions] == [2]


# --- views ---------------------------------------------------------------------------------------------


def _views(*bodies: ev.Event) -> dict[str, api.NodeInfo]:
    log = Log(*cluster(nodes=2))
    log.add(*bodies)
    return {n.name: n for n in nodes_reply(log.state, CONFIG, api.NodesRequest()).nodes}


@pytest.mark.parametrize(
    ("bodies", "state", "scontrol"),
    [
        ([drain("gpu02")], "drained", "IDLE+DRAIN"),
        ([submitted(1, job(nodes=1, gpus=2)), allocated(1, {"gpu02": [0, 1]}), drain("gpu02")],
         "draining", "MIXED+DRAIN"),
        ([submitted(1, job(nodes=1, gpus=8)), allocated(1, {"gpu02": list(range(8))}), drain("gpu02")],
         "draining", "ALLOCATED+DRAIN"),
        ([drain("gpu02"), ev.NodeDown(node="gpu02", reason="Not responding")], "down", "DOWN*+DRAIN"),
        ([mismatch("gpu02")], "drained", "IDLE+DRAIN"),
        ([], "idle", "IDLE"),
    ],
    ids=["idle-drain", "mixed-drain", "allocated-drain", "down-drain", "registration-drain", "idle"],
)  # fmt: skip
def test_node_state_views(bodies: list[ev.Event], state: str, scontrol: str) -> None:
    info = _views(*bodies)["gpu02"]
    assert (info.state, scontrol_nodes.node_state_text(info)) == (state, scontrol)
    assert f"State={scontrol} " in " ".join(scontrol_nodes.show_node(info))


def down(node: str, reason: str = "PSU failed", by: str = "root") -> ev.NodeDown:
    return ev.NodeDown(node=node, reason=reason, by=by)


def test_an_admins_down_requeues_the_job_and_kills_its_run_through_the_agent() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, gpus=8)), allocated(1, {"gpu02": list(range(8))}))
    log.add(ev.RunStarted(job_id=1, attempt=0, node="gpu02", pid=42), down("gpu02"))
    node = log.state.nodes["gpu02"]
    assert (node.up, node.reason, node.admin_down) == (False, "PSU failed", AdminDrain(reason="PSU failed",
            by="root", at=log.at))  # fmt: skip
    out = plan(log.state, log.at, policy())
    requeued = [d for d in out.decisions if isinstance(d, ev.JobRequeued)]
    assert [d.job_id for d in requeued] == [1]
    log.add(*out.decisions, step=0.0)
    # The run may still run on the (responding) node: it is an orphan, killed through gpu02's agent.
    kills = [o for o in orders(log.state, policy()) if isinstance(o, api.KillOrder)]
    assert [(k.job_id, k.attempt, k.node) for k in kills] == [(1, 0, "gpu02")]
    log.add(exited(1, "gpu02", signal=15, killed=True))
    assert not log.state.orphans


def test_an_admins_down_lasts_until_resume_whatever_the_agent_does() -> None:
    log = Log(*cluster(nodes=2))
    log.add(down("gpu02"), registered("gpu02"), ev.NodeUp(node="gpu02"))
    assert not log.state.nodes["gpu02"].up and sorted(free_capacity(log.state.nodes)) == ["gpu01"]
    log.add(resume("gpu02"))
    node = log.state.nodes["gpu02"]
    assert (node.up, node.reason, node.admin_down) == (True, "", None)
    # A node that stops responding is down until it heartbeats again (NodeUp), as before.
    log.add(ev.NodeDown(node="gpu02", reason="Not responding"), ev.NodeUp(node="gpu02"))
    assert log.state.nodes["gpu02"].up


def test_an_admins_down_shows_down_without_star_and_its_admin() -> None:
    info = _views(down("gpu02", by="ops"))["gpu02"]
    assert (info.state, info.admin_down, info.reason_user) == ("down", True, "ops")
    assert scontrol_nodes.node_state_text(info) == "DOWN"
    assert sinfo.node_state(info) == ("DOWN", "down")
    assert scontrol_nodes.show_node(info, UTC)[-1] == "Reason=PSU failed [ops@2023-11-14T22:13:22]"
    lost = _views(ev.NodeDown(node="gpu02", reason="Not responding"))["gpu02"]
    assert (scontrol_nodes.node_state_text(lost), sinfo.node_state(lost)) == ("DOWN*", ("DOWN*", "down*"))


def test_an_admin_reason_shows_its_user_and_time() -> None:
    info = _views(drain("gpu02", "bad fan", by="ops"))["gpu02"]
    assert (info.reason, info.reason_user, info.reason_time, info.drained) == ("bad fan", "ops", T0 + 2, True)
    lines = scontrol_nodes.show_node(info, UTC)
    assert lines[-1] == "Reason=bad fan [ops@2023-11-14T22:13:22]"
    # A registration drain and a down node show Corral's reason without a user.
    mism = _views(mismatch("gpu02"))["gpu02"]
    assert scontrol_nodes.show_node(mism)[-1] == "Reason=gres/gpu count reported lower"
    down = _views(drain("gpu02"), ev.NodeDown(node="gpu02", reason="Not responding"))["gpu02"]
    assert (down.reason, down.reason_user) == ("Not responding", "")


def test_sinfo_shows_drng_then_drain_and_lists_the_reason() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, gpus=2)), allocated(1, {"gpu02": [0, 1]}), drain("gpu02", by="ops"))
    layout = sinfo.parse_format("%N %t", True)

    def shown(states: set[str]) -> list[str]:
        reply = sinfo.with_states(nodes_reply(log.state, CONFIG, api.NodesRequest()), states)
        return sinfo.render_sinfo(reply, layout, header=False, node_oriented=True, partitions=["gpu"])

    assert shown(set()) == ["gpu01 idle", "gpu02 drng"]
    assert shown(sinfo.parse_node_states(["drain"])) == ["gpu02 drng"]
    assert shown(sinfo.parse_node_states(["drng"])) == ["gpu02 drng"]
    log.add(exited(1, "gpu02"), ev.JobCompleted(job_id=1, attempt=0))
    assert shown(set()) == ["gpu01 idle", "gpu02 drain"]
    assert shown(sinfo.parse_node_states(["drng"])) == []
    reasons = sinfo.with_states(nodes_reply(log.state, CONFIG, api.NodesRequest()), set(sinfo.REASON_STATES))
    out = sinfo.render_sinfo(reasons, sinfo.parse_format(sinfo.REASONS_FORMAT, False), partitions=["gpu"])
    assert out[0].split() == ["REASON", "USER", "TIMESTAMP", "NODELIST"]
    assert out[1].split()[:3] == ["bad", "fan", "ops"] and out[1].endswith(" gpu02"), out


def test_cpu_summary_of_a_draining_node() -> None:
    info = _views(submitted(1, job(nodes=1, gpus=2)), allocated(1, {"gpu02": [0, 1]}, cpus=4), drain("gpu02"))
    assert sinfo.cpu_summary([info["gpu02"]]) == "4/0/60/64"


# --- roles and accounting ---------------------------------------------------------------------------------


def test_only_the_gateway_asks_and_only_health_answers() -> None:
    gateway = roles.service_user(roles.GATEWAY, "pw").publish
    health = roles.service_user(roles.HEALTH, "pw").publish
    agent = roles.agent_user("gpu01", "pw").publish
    for tag in ("node_drain_requested", "node_resume_requested"):
        assert subjects.node_subject("*", tag) in gateway
        assert subjects.node_subject("*", tag) not in health
    for tag in ("node_drained", "node_resumed"):
        assert subjects.node_subject("*", tag) in health
        assert subjects.node_subject("*", tag) not in gateway
    assert not any("drain" in s or "resum" in s for s in agent)
    assert subjects.api_subject("update_node", "*") in roles.service_user(roles.GATEWAY, "pw").subscribe


def test_accounting_ignores_node_drains() -> None:
    bodies: list[ev.Event] = [
        ev.NodeDrainRequested(node="gpu01", user="root", reason="x"),
        drain("gpu01"),
        ev.NodeResumeRequested(node="gpu01", user="root"),
        resume("gpu01"),
    ]
    entries = [(seq, ev.Envelope(meta=ev.Meta(event_id=str(seq), occurred_at=T0, actor="t"), body=b))
               for seq, b in enumerate(bodies, 1)]  # fmt: skip
    assert convert(entries) == []
