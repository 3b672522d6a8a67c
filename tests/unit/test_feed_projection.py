"""The feed's projection: the fold's verdicts, as feed messages (pure)."""

from __future__ import annotations

from builders import allocated, env, exited, job, registered, submitted

from corral.schemas import events as ev
from corral.schemas import feed
from corral.schemas.job_spec import ArrayRange, ArraySpec
from corral.services.feed.project import Projector


def project(*bodies: ev.Event) -> list[tuple[str, str, feed.FeedEvent]]:
    """(subject, message id, event) of every message the bodies make, in order (seq 1, 2, ...)."""
    p = Projector()
    out = []
    for seq, body in enumerate(bodies, start=1):
        out += [(m.subject, m.msg_id, m.message.event) for m in p.add(seq, env(body))]
    return out


def test_a_job_s_lifecycle_is_submitted_started_requeued_started_ended() -> None:
    messages = project(
        registered("gpu01"),
        submitted(5, job(nodes=1, gpus=2, account="ml"), user="alice"),
        allocated(5, {"gpu01": [0, 1]}),
        ev.JobRequeued(job_id=5, attempt=0, reason="NodeFail"),
        allocated(5, {"gpu01": [2, 3]}, attempt=1),  # the first run may still hold 0 and 1
        exited(5, "gpu01", attempt=1, exit_code=3),
        ev.JobFailed(job_id=5, attempt=1, reason="NonZeroExitCode", exit_code=3),
    )
    assert [(s, i) for s, i, _ in messages] == [
        ("corral.feed.v1.job.ml.alice.5.submitted", "feed:2:0"),
        ("corral.feed.v1.job.ml.alice.5.started", "feed:3:0"),
        ("corral.feed.v1.job.ml.alice.5.requeued", "feed:4:0"),
        ("corral.feed.v1.job.ml.alice.5.started", "feed:5:0"),
        ("corral.feed.v1.job.ml.alice.5.ended", "feed:7:0"),
    ]
    started, ended = messages[3][2], messages[4][2]
    assert isinstance(started, feed.FeedStarted) and (started.attempt, started.nodes, started.gpus) == (
        1,
        ["gpu01"],
        2,
    )
    assert ended == feed.FeedEnded(
        job_id=5, user="alice", state="FAILED", exit_code=3, signal=0, reason="NonZeroExitCode"
    )


def test_what_the_fold_ignores_is_not_in_the_feed() -> None:
    messages = project(
        registered("gpu01"),
        submitted(5, job(nodes=1, gpus=1)),
        submitted(5, job(nodes=1, gpus=1), user="mallory"),  # a taken id
        allocated(5, {"gpu01": [0]}, epoch=2),
        ev.JobCompleted(job_id=5, attempt=0, epoch=1),  # a deposed leader's
        ev.JobCompleted(job_id=5, attempt=3, epoch=2),  # another run's
    )
    assert [type(e).__name__ for _, _, e in messages] == ["FeedSubmitted", "FeedStarted"]


def test_an_array_submission_is_one_message_per_task_with_its_own_id() -> None:
    spec = job(nodes=1, gpus=0, array=ArraySpec(ranges=[ArrayRange(start=0, end=2)]))
    messages = project(submitted(10, spec, user="bob"))
    assert [(s, i) for s, i, _ in messages] == [
        ("corral.feed.v1.job._.bob.10.submitted", "feed:1:0"),
        ("corral.feed.v1.job._.bob.11.submitted", "feed:1:1"),
        ("corral.feed.v1.job._.bob.12.submitted", "feed:1:2"),
    ]
    assert [e.array_task_id for _, _, e in messages] == [0, 1, 2]  # type: ignore[union-attr]


def test_a_node_s_changes() -> None:
    messages = project(
        registered("gpu01"),
        ev.NodeDown(node="gpu01", reason="Not responding"),
        ev.NodeUp(node="gpu01"),
        ev.NodeDrained(node="gpu01", reason="bad GPU", by="root"),
        ev.NodeResumed(node="gpu01", by="root"),
    )
    assert [(s, e.reason) for s, _, e in messages] == [  # type: ignore[union-attr]
        ("corral.feed.v1.node.gpu01.down", "Not responding"),
        ("corral.feed.v1.node.gpu01.up", ""),
        ("corral.feed.v1.node.gpu01.drained", "bad GPU"),
        ("corral.feed.v1.node.gpu01.resumed", ""),
    ]
