"""``corral trace``'s drawing: the tree, start offsets, durations, a bar per span, the span events."""

from __future__ import annotations

import pytest
from builders import allocated, job

from corral.libs.trace import derive
from corral.libs.trace.render import BAR, FIXED, MIN_BAR, NAME, duration, render
from corral.libs.trace.spans import SpanRecord
from corral.schemas import codec
from corral.schemas import events as ev

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("ns", "text"),
    [(412_000_000, "0.412s"), (723 * 10**9, "12m03s"), (10_920 * 10**9, "3h02m"), (363_600 * 10**9, "4d05h")],
    ids=["seconds", "minutes", "hours", "days"],
)
def test_durations_read_as_people_write_them(ns: int, text: str) -> None:
    assert duration(ns) == text


def requeued_trace() -> list[SpanRecord]:
    """Job 4's spans: run on n1, requeued when n1 goes down, queued again."""
    bodies: list[ev.Event] = [
        ev.JobSubmitted(job_id=4, user="alice", spec=job(gpus=1, nodes=1)),
        allocated(4, {"n1": [0]}),
        ev.RunStarted(job_id=4, attempt=0, node="n1", pid=9),
        ev.NodeDown(node="n1", reason="Not responding"),
        ev.JobRequeued(job_id=4, attempt=0, reason="NodeFail"),
    ]
    entries = [
        (seq, codec.envelope(b, actor="t", occurred_at=100.0 + 2 * seq, event_id=f"e{seq}"))
        for seq, b in enumerate(bodies, start=1)
    ]
    return derive.spans(4, entries)


def test_the_tree_shows_offsets_durations_bars_and_events() -> None:
    text = render(4, requeued_trace(), now_ns=120 * 10**9)
    lines = text.splitlines()
    assert lines[0].startswith("job 4: trace ") and lines[0].endswith(", 7 spans")
    rows = {line[:NAME].strip(" │├└─"): line[NAME:].split() for line in lines[2:] if "· " not in line}
    assert rows["submit"][:2] == ["+0.000s", "0.000s"]
    assert rows["attempt 0"][:2] == ["+2.000s", "6.000s"]
    # The second queue wait is open: it runs to "now", marked with an ellipsis.
    assert rows["queued 1"][:2] == ["+8.000s", "10.000s…"]
    assert rows["job 4"][2] == "|" + "█" * BAR + "|"
    assert "└─ job 4" in text and "├─ attempt 0" in text and "├─ launch n1" in text
    assert rows["run n1 ✗"]  # ended by its node going down: an error
    events = [line.strip(" │") for line in lines if "· " in line]
    assert events[0] == '· node_down +6.000s host.name=n1 node.reason="Not responding"'
    assert events[1].startswith("· requeued +8.000s requeue.reason=NodeFail cause=NodeDown")
    assert "cause.node=n1" in events[1]


@pytest.mark.parametrize(
    "width", [76, 60, 40], ids=["80-column-terminal", "narrow", "narrower-than-the-tree"]
)
def test_a_width_narrows_the_columns_and_wraps_the_events(width: int) -> None:
    wide = render(4, requeued_trace(), now_ns=120 * 10**9).splitlines()
    lines = render(4, requeued_trace(), now_ns=120 * 10**9, width=width).splitlines()
    spans = [line for line in lines[2:] if line.endswith("|")]
    names = [line.split(" +")[0].rstrip() for line in spans]
    # The tree column is as wide as its longest name; the bar takes what is left, MIN_BAR at the least.
    bar = max(MIN_BAR, width - max(map(len, names)) - FIXED)
    assert all(len(line) <= width for line in lines if line.endswith("|")) or bar == MIN_BAR
    assert all(len(line.split("|")[1]) == bar for line in spans), spans
    assert names == [line.split(" +")[0].rstrip() for line in wide[2:] if line.endswith("|")]
    # Every event's words are there, wrapped within the width.
    events = [line for line in lines[2:] if not line.endswith("|")]
    assert all(len(line) <= width for line in events), events
    assert " ".join(w for line in events for w in line.split() if w not in "│") == " ".join(
        w for line in wide[2:] if not line.endswith("|") for w in line.split() if w not in "│"
    )
