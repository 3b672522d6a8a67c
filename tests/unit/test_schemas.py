"""The contract: JSON Schema files are current, tags are stable, every event has its one subject."""

from __future__ import annotations

import pytest

from corral.schemas import api, events, generate, subjects
from corral.schemas.codec import DecodeError, decode, decode_envelope, encode, envelope

pytestmark = pytest.mark.unit


def test_json_schema_files_are_current() -> None:
    for name, text in generate.render().items():
        path = generate.SCHEMA_DIR / name
        assert path.exists(), f"{name} missing: run python -m corral.schemas.generate"
        assert path.read_text() == text, f"{name} is stale: run python -m corral.schemas.generate"


def test_tags_are_unique_and_never_retired() -> None:
    tags = [t.__struct_config__.tag for t in events.EVENT_TYPES]
    assert len(tags) == len(set(tags))
    assert not set(tags) & events.RETIRED_TAGS


def test_event_types_match_the_union() -> None:
    assert set(events.EVENT_TYPES) == set(events.Event.__args__)


@pytest.mark.parametrize(
    ("body", "subject"),
    [
        (events.JobCancelRequested(job_id=7, user="a"), "corral.evt.job.7.job_cancel_requested"),
        (events.RunExited(job_id=7, attempt=0, node="n1", exit_code=0), "corral.evt.job.7.run_exited.n1"),
        (events.NodeDown(node="n1", reason="x"), "corral.evt.node.n1.node_down"),
    ],
    ids=["intent", "run-fact-names-node", "node-fact"],
)
def test_event_subjects(body: events.Event, subject: str) -> None:
    assert subjects.event_subject(body) == subject


def test_envelope_round_trip() -> None:
    env = envelope(events.NodeUp(node="n1"), actor="corral-health", occurred_at=1.5, event_id="e1")
    assert decode_envelope(encode(env)) == env


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b'{"type":"submit","token":"t","spec":{"name":"x"}}', "spec"),
        (b'{"type":"submit","token":5}', "token"),
        (b"[", "expected `object`"),
    ],
    ids=["missing-spec-fields", "wrong-type", "not-json"],
)
def test_bad_api_messages_name_the_problem(data: bytes, needle: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(data, api.SubmitRequest)
    assert needle.lower() in str(info.value).lower()


def test_api_subject_carries_the_caller() -> None:
    assert subjects.api_caller(subjects.api_subject("submit", "alice")) == ("submit", "alice")
    with pytest.raises(ValueError):
        subjects.api_caller("corral.api.v1.submit")
