"""``corral audit``'s text and JSON (``cli/audit_format.py``): one line per event, with who and why."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from builders import T0, allocated, exited, job, submitted

from corral.cli.audit import _parser, request_of
from corral.cli.audit_format import as_json, label, lines, render, what_of
from corral.cli.errors import CliError
from corral.schemas import api, codec
from corral.schemas import events as ev

pytestmark = pytest.mark.unit
UTC = dt.UTC


class History:
    """Entries of a history built in order, each ``at`` one second after the previous, with its cause."""

    def __init__(self) -> None:
        self.entries: list[api.HistoryEntry] = []
        self.causes: list[api.HistoryEntry] = []

    def add(self, body: ev.Event, actor: str, cause: str | None = None, outside: bool = False) -> str:
        """Add an entry (to the reply's causes if ``outside``); its event id."""
        seq = len(self.entries) + len(self.causes) + 1
        envelope = codec.envelope(
            body, actor=actor, occurred_at=T0 + seq, event_id=f"e{seq}", causation_id=cause
        )
        (self.causes if outside else self.entries).append(api.HistoryEntry(seq=seq, envelope=envelope))
        return f"e{seq}"

    def reply(self, truncated: bool = False) -> api.HistoryReply:
        return api.HistoryReply(entries=self.entries, causes=self.causes, truncated=truncated)


def requeued_then_cancelled() -> History:
    """Job 1: submitted by alice, runs on node1 and node2, requeued when node2 stops responding, then
    cancelled by the admin."""
    h = History()
    submit = h.add(submitted(1, job(gpus=2, nodes=2, time_s=3600)), "alice")
    first = h.add(allocated(1, {"node1": [0, 1], "node2": [0, 1]}), "corral-scheduler", submit)
    h.add(ev.RunStarted(job_id=1, attempt=0, node="node1", pid=42), "agent-node1", first)
    down = h.add(ev.NodeDown(node="node2", reason="Not responding"), "corral-health", outside=True)
    requeue = h.add(ev.JobRequeued(job_id=1, attempt=0, reason="NodeFail"), "corral-scheduler", down)
    h.add(allocated(1, {"node3": [0, 1]}, attempt=1), "corral-scheduler", requeue)
    cancel = h.add(ev.JobCancelRequested(job_id=1, user="root"), "corral-gateway")
    h.add(ev.JobCancelled(job_id=1, attempt=1, by="root"), "corral-scheduler", cancel)
    return h


def test_each_event_is_one_line_with_its_time_actor_what_and_why() -> None:
    text = render(requeued_then_cancelled().reply(), tz=UTC)
    assert text.splitlines() == [
        "2023-11-14T22:13:21.000  job_submitted         alice             name=train user=alice nodes=2 "
        "ntasks=2 gres=gpu:2 time_limit=1:00:00",
        "2023-11-14T22:13:22.000  job_allocated         corral-scheduler  attempt=0 partition=gpu "
        'nodes=node[1-2] gpus="node1:0,1 node2:0,1" time_limit=1:00:00  ← job_submitted by alice',
        "2023-11-14T22:13:23.000  run_started           agent-node1       attempt=0 node=node1 pid=42  "
        "← job_allocated  ← job_submitted by alice",
        "2023-11-14T22:13:25.000  job_requeued          corral-scheduler  attempt=0 reason=NodeFail  "
        "← node_down node2 (Not responding)  ← missed heartbeats",
        "2023-11-14T22:13:26.000  job_allocated         corral-scheduler  attempt=1 partition=gpu "
        "nodes=node3 gpus=node3:0,1 time_limit=1:00:00  ← job_requeued NodeFail  "
        "← node_down node2 (Not responding)  ← missed heartbeats",
        "2023-11-14T22:13:27.000  job_cancel_requested  root              user=root",
        "2023-11-14T22:13:28.000  job_cancelled         corral-scheduler  attempt=1 by=root  "
        "← job_cancel_requested by root",
    ]


def test_the_json_has_each_lines_fields_and_its_envelope() -> None:
    reply = requeued_then_cancelled().reply()
    data = json.loads(as_json(reply))
    assert data["truncated"] is False
    requeued = data["entries"][3]
    assert {k: requeued[k] for k in ("seq", "event", "job_id", "actor", "why")} == {
        "seq": 5,
        "event": "job_requeued",
        "job_id": 1,
        "actor": "corral-scheduler",
        "why": ["node_down node2 (Not responding)", "missed heartbeats"],
    }
    assert requeued["envelope"]["meta"]["causation_id"] == "e4"
    assert requeued["what"] == {"attempt": "0", "reason": "NodeFail"}


def test_a_cause_the_reply_does_not_hold_is_named_by_its_id_and_an_admins_down_by_the_admin() -> None:
    h = History()
    request = h.add(
        ev.NodeDownRequested(node="node2", user="root", reason="bad fan"), "corral-gateway", None, True
    )
    down = h.add(ev.NodeDown(node="node2", reason="bad fan", by="root"), "corral-health", request, True)
    h.add(ev.JobRequeued(job_id=7, attempt=0, reason="NodeFail"), "corral-scheduler", down)
    h.add(
        ev.JobFailed(job_id=7, attempt=1, reason="NonZeroExitCode", exit_code=3), "corral-scheduler", "gone"
    )
    (requeued, failed) = lines(h.reply())
    assert requeued.why == [
        "node_down node2 (bad fan) by root",
        "node_down_requested node2 (bad fan) by root",
    ]
    assert failed.why == ["event gone"]
    assert failed.what == {"attempt": "1", "reason": "NonZeroExitCode", "exit_code": "3"}


def test_a_nodes_history_shows_each_lines_job_and_a_truncated_one_says_so() -> None:
    h = History()
    h.add(exited(12, "node1", exit_code=1), "agent-node1")
    text = render(h.reply(truncated=True), tz=UTC, jobs=True)
    assert text.splitlines() == [
        "2023-11-14T22:13:21.000        12  run_exited  agent-node1  attempt=0 node=node1 exit_code=1",
        "(older entries left out: ask for fewer jobs, or a larger --limit)",
    ]


@pytest.mark.parametrize(
    ("body", "context", "text"),
    [
        (ev.JobSubmitted(job_id=9, user="bob", spec=job()), 1, "job_submitted 9 by bob"),
        (ev.JobPreempted(job_id=1, attempt=0, mode="requeue", by_job=9), 1, "job_preempted"),
        (ev.RunExited(job_id=1, attempt=0, node="n1", exit_code=0), 1, "run_exited n1"),
        (ev.NodeDrained(node="n1", reason="maint", by="root"), None, "node_drained n1 (maint) by root"),
    ],
    ids=["another-job", "same-job", "run-fact", "node"],
)
def test_a_cause_is_labelled_by_its_tag_what_it_is_about_and_who_asked(
    body: ev.Event, context: int | None, text: str
) -> None:
    assert label(body, context) == text


def test_what_leaves_out_defaults_and_the_job_id() -> None:
    assert what_of(ev.JobRequeued(job_id=1, attempt=2, reason="Requested")) == {
        "attempt": "2",
        "reason": "Requested",
    }


def test_a_steps_tasks_read_as_sacct_exit_codes_by_rank_and_node() -> None:
    lost = ev.TaskOutcome(rank=0, node="node1", signal=9, error="node node1: the step supervisor vanished")
    ended = ev.TaskOutcome(rank=1, node="node2", pid=7, started_at=T0, ended_at=T0 + 3, signal=15)
    killed = ev.TaskOutcome(rank=2, node="node2", signal=9, oom=True)
    body = ev.StepExited(job_id=1, attempt=0, step_id=0, node="node1", exit_code=0, signal=15,
                         tasks=[lost, ended, killed])  # fmt: skip
    assert what_of(body) == {
        "attempt": "0",
        "step_id": "0",
        "node": "node1",
        "exit_code": "0",
        "signal": "15",
        "tasks": "0@node1=0:9,1@node2=0:15,2@node2=0:9(oom)",
        "task_errors": "0: node node1: the step supervisor vanished",
    }


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        ([], "give exactly one of a job id, --node NAME and --user NAME"),
        (["12", "--node", "n1"], "give exactly one"),
        (["12_x"], "job id: '12_x' is not a job id (a job N or an array task A_T, e.g. 12 or 12_3)"),
        (["12_[1-3]"], "job id: '12_[1-3]' is not a job id"),
        (["12.0"], "job id: '12.0' is not a job id"),
        (["0"], "job id: '0' is not a job id"),
        (["12", "--limit", "0"], "--limit must be 1-10000, not 0"),
    ],
    ids=["none", "two", "bad-task", "task-list", "step", "zero", "limit"],
)
def test_bad_arguments_are_refused_naming_the_fix(argv: list[str], error: str) -> None:
    with pytest.raises(CliError, match=re.escape(error)):
        request_of(_parser().parse_args(argv))


def test_the_arguments_make_the_request() -> None:
    assert request_of(_parser().parse_args(["12"])) == api.HistoryRequest(job_id=12)
    assert request_of(_parser().parse_args(["12_3"])) == api.HistoryRequest(job_id=12, array_task=3)
    assert request_of(_parser().parse_args(["--user", "bob", "--limit", "5"])) == api.HistoryRequest(
        user="bob", limit=5
    )
