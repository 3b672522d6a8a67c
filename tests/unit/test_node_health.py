"""Health reports: what is accepted (size, schema, the reporter's scope), what a failing one calls for,
the fold's requeue of a health drain, health's shell on the in-memory log, the health-check program."""

from __future__ import annotations

import dataclasses
import stat
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.libs.core import node_health
from corral.libs.core.orders import orders
from corral.libs.core.plan import plan
from corral.libs.core.scopes import ServiceAccount
from corral.libs.runtime.memlog import MemLog
from corral.schemas import api, subjects
from corral.schemas import events as ev
from corral.services.agent.healthcheck import run_program
from corral.services.health.reports import HealthReports
from tests.unit.builders import Log, allocated, cluster, cluster_config, exited, job, policy, submitted

pytestmark = [pytest.mark.unit, pytest.mark.timeout(20)]

DCGM = ServiceAccount(name="dcgm", report_nodes=("gpu01", "gpu02"))
ACCOUNTS = (DCGM, ServiceAccount(name="ci", submit_accounts=("ml",)))
DCGM_GPU01 = ServiceAccount(name="dcgm", report_nodes=("gpu01",))
XID = ev.HealthCheck(kind="xid", code="79", gpu=3, message="GPU has fallen off the bus")


def report(node: str = "gpu01", severity: str = "fail", **fields: object) -> bytes:
    body = {
        "node": node,
        "source": "dcgm",
        "severity": severity,
        "checks": [msgspec.to_builtins(XID)],
        **fields,
    }
    return msgspec.json.encode(body)


@pytest.mark.parametrize(
    ("reporter", "node", "data", "refused"),
    [
        ("svc-dcgm", "gpu01", report(), None),
        ("agent-gpu03", "gpu03", report("gpu03"), None),
        ("svc-dcgm", "gpu03", report("gpu03"), "service account 'dcgm' may not report the health of node "
         "'gpu03': its scope is no submit-for; report-health nodes=gpu[01-02]"),
        ("svc-ci", "gpu01", report(), "may not report the health of node 'gpu01'"),
        ("svc-nobody", "gpu01", report(), "'svc-nobody' is not a service account with a report-health scope"),
        ("alice", "gpu01", report(), "'alice' is not a service account"),
        ("agent-gpu02", "gpu01", report(), "agent 'agent-gpu02' may report only its own node's health"),
        ("svc-dcgm", "gpu01", b"{not json", "not a node health report"),
        ("svc-dcgm", "gpu01", report(severity="dead"), "Invalid enum value 'dead' - at `$.severity`"),
        ("svc-dcgm", "gpu01", report(checks=[{"kind": "xid", "message": "m" * 600}]),
         "not a node health report: Expected `str` of length <= 512"),
        ("svc-dcgm", "gpu01", report(checks=[{"kind": "ecc"}] * 65), "Expected `array` of length <= 64"),
        ("svc-dcgm", "gpu01", report("gpu02"), "about node 'gpu02' but was published for node 'gpu01'"),
        ("svc-dcgm", "gpu01", b" " * (node_health.MAX_REPORT_BYTES + 1), "larger than 65536"),
    ],
    ids=["in-scope", "own-agent", "out-of-scope", "no-report-scope", "unknown-account", "person",
         "other-agent", "not-json", "bad-severity", "long-message", "too-many-checks", "node-mismatch",
         "too-big"],
)  # fmt: skip
def test_a_report_is_accepted_only_within_bounds_schema_and_scope(
    reporter: str, node: str, data: bytes, refused: str | None
) -> None:
    got = node_health.accept(data, reporter, node, ACCOUNTS)
    if refused is None:
        assert isinstance(got, ev.NodeHealthReported) and got.reporter == reporter
    else:
        assert isinstance(got, str) and refused in got


def test_the_reporter_is_the_subjects_never_the_bodys() -> None:
    got = node_health.accept(report(reporter="root"), "svc-dcgm", "gpu01", ACCOUNTS)
    assert isinstance(got, ev.NodeHealthReported) and got.reporter == "svc-dcgm"


def accepted(severity: str = "fail", checks: list[ev.HealthCheck] | None = None) -> ev.NodeHealthReported:
    return ev.NodeHealthReported(
        node="gpu01", source="dcgm", severity=severity, checks=[XID] if checks is None else checks,  # type: ignore[arg-type]
        reporter="svc-dcgm",
    )  # fmt: skip


def test_a_failing_report_drains_with_its_checks_as_reason() -> None:
    reason = "dcgm: xid 79 gpu 3: GPU has fallen off the bus; ecc 2 gpu 1"
    failing = accepted(checks=[XID, ev.HealthCheck(kind="ecc", code="2", gpu=1)])
    assert node_health.drain_reason(failing) == reason
    assert node_health.drain_for(failing, "requeue", None) == ev.NodeDrained(
        node="gpu01", reason=reason, by="svc-dcgm", requeue=True
    )
    assert node_health.drain_for(failing, "drain", "bad fan") == ev.NodeDrained(
        node="gpu01", reason=reason, by="svc-dcgm", requeue=False
    )
    # Repeated while the node is drained for it: nothing; ok and warning reports never drain.
    assert node_health.drain_for(failing, "requeue", reason) is None
    assert node_health.drain_for(accepted("ok"), "requeue", None) is None
    assert node_health.drain_for(accepted("warning"), "requeue", None) is None


def test_a_drain_reason_is_one_bounded_line() -> None:
    long = accepted(checks=[ev.HealthCheck(kind="healthcheck", message="a\nb\tc " + "x" * 400)])
    reason = node_health.drain_reason(long)
    assert "\n" not in reason and "\t" not in reason and len(reason) == ev.MAX_NODE_REASON
    assert node_health.drain_reason(accepted(checks=[])) == "dcgm: other: failed"
    # A check of the source's own kind is not named twice.
    program = ev.NodeHealthReported(
        node="gpu01", source="healthcheck", severity="fail", reporter="agent-gpu01",
        checks=[ev.HealthCheck(kind="healthcheck", code="exit 1", message="GPU 2 missing"),
                ev.HealthCheck(kind="healthcheck", message="fan"), ev.HealthCheck(kind="healthcheck")],
    )  # fmt: skip
    assert node_health.drain_reason(program) == "healthcheck: exit 1: GPU 2 missing; fan; healthcheck"


def test_a_requeue_drain_requeues_the_nodes_requeueable_jobs_and_leaves_the_others() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, gpus=2)), allocated(1, {"gpu01": [0, 1]}))
    log.add(submitted(2, job(nodes=1, gpus=2, requeue=False)), allocated(2, {"gpu01": [2, 3]}))
    log.add(submitted(3, job(nodes=1, gpus=2)), allocated(3, {"gpu02": [0, 1]}))
    state = log.add(ev.NodeDrained(node="gpu01", reason="dcgm: xid 79", by="svc-dcgm", requeue=True))
    assert [state.jobs[j].requeue_by for j in (1, 2, 3)] == ["svc-dcgm", None, None]
    # The run is killed, then concluded as a requested requeue; the node stays drained.
    kills = [o for o in orders(state, policy()) if isinstance(o, api.KillOrder)]
    assert [(o.job_id, o.node, o.reason) for o in kills] == [(1, "gpu01", "requeue")]
    log.add(exited(1, "gpu01", signal=15))
    out = plan(log.state, log.at, policy())
    assert ev.JobRequeued(job_id=1, attempt=0, reason="Requested") in out.decisions
    assert not any(getattr(d, "job_id", None) == 2 for d in out.decisions)


def test_a_plain_drain_requeues_nothing() -> None:
    log = Log(*cluster(nodes=2))
    log.add(submitted(1, job(nodes=1, gpus=2)), allocated(1, {"gpu01": [0, 1]}))
    state = log.add(ev.NodeDrained(node="gpu01", reason="dcgm: xid 79", by="svc-dcgm"))
    assert state.jobs[1].requeue_by is None


async def test_health_appends_the_report_then_the_drain_it_causes() -> None:
    log = MemLog(actor="corral-health")
    config = dataclasses.replace(cluster_config(nodes=2), service_accounts=(DCGM_GPU01,))
    reports = HealthReports(log, config, {}, {})
    subject = subjects.health_report_subject("svc-dcgm", "gpu01")
    assert await reports.handle(subject, report()) is None
    record, drain = log.bodies("corral.evt.node.gpu01.>")
    assert isinstance(record, ev.NodeHealthReported) and record.reporter == "svc-dcgm"
    assert isinstance(drain, ev.NodeDrained) and drain.requeue and drain.by == "svc-dcgm"
    # The same report again changes nothing; a refused one appends nothing and says why.
    assert await reports.handle(subject, report()) is None
    refused = await reports.handle(subjects.health_report_subject("svc-dcgm", "gpu02"), report("gpu02"))
    assert refused is not None and "may not report the health of node 'gpu02'" in refused
    assert (
        await reports.handle("corral.ext.health.x", b"{}")
        == "not a health report subject: 'corral.ext.health.x'"
    )
    assert len(log.bodies("corral.evt.>")) == 2


def _program(tmp_path: Path, body: str) -> str:
    path = tmp_path / "check.sh"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.mark.parametrize(
    ("body", "timeout", "check"),
    [
        ("exit 0", 5.0, None),
        ('echo "GPU 2 missing"; echo more; exit 1', 5.0,
         ev.HealthCheck(kind="healthcheck", code="exit 1", message="GPU 2 missing")),
        ('echo "node $CORRAL_NODE: fan"', 5.0, ev.HealthCheck(kind="healthcheck", code="exit 0",
                                                               message="node gpu01: fan")),
        ("exit 3", 5.0, ev.HealthCheck(kind="healthcheck", code="exit 3")),
        ("sleep 5", 0.3, None),  # replaced below: the message names the program
    ],
    ids=["passes", "fails-with-output", "output-only", "exit-only", "timeout"],
)  # fmt: skip
async def test_the_health_check_program_fails_on_exit_status_or_output(
    tmp_path: Path, body: str, timeout: float, check: ev.HealthCheck | None
) -> None:
    program = _program(tmp_path, body)
    got = await run_program(program, "gpu01", timeout)
    if body.startswith("sleep"):
        assert got == ev.HealthCheck(kind="healthcheck", code="timeout", message=f"{program} ran over 0.3s")
    else:
        assert got == check


async def test_a_missing_health_check_program_is_a_failure(tmp_path: Path) -> None:
    got = await run_program(str(tmp_path / "nope"), "gpu01", 1.0)
    assert got is not None and got.code == "not run" and "No such file" in got.message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "node": st.sampled_from(["gpu01", "gpu02", "", "gpu01.x"]) | JSON,
        "source": st.sampled_from(["dcgm", "healthcheck", "x"]) | JSON,
        "severity": st.sampled_from(["ok", "warning", "fail", "FAIL"]) | JSON,
        "checks": st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "kind": st.sampled_from(["xid", "ecc", "healthcheck", "bogus"]) | JSON,
                    "code": JSON,
                    "message": st.text(max_size=600) | JSON,
                    "gpu": st.integers(-5, 2000) | JSON,
                },
            ),
            max_size=70,
        )
        | JSON,
        "reporter": JSON,
    },
)


@settings(max_examples=200, deadline=timedelta(seconds=1), suppress_health_check=[HealthCheck.too_slow])
@given(body=FIELDS, reporter=st.sampled_from(["svc-dcgm", "svc-ci", "agent-gpu01", "alice"]))
def test_any_report_is_accepted_or_refused_with_a_reason_never_a_crash(
    body: dict[str, object], reporter: str
) -> None:
    got = node_health.accept(msgspec.json.encode(body), reporter, "gpu01", ACCOUNTS)
    if isinstance(got, str):
        assert got
        return
    assert got.node == "gpu01" and got.reporter == reporter and len(got.checks) <= ev.MAX_HEALTH_CHECKS
    drain = node_health.drain_for(got, "requeue", None)
    assert drain is None or (len(drain.reason) <= ev.MAX_NODE_REASON and "\n" not in drain.reason)
