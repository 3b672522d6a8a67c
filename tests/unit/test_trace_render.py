"""``corral trace``'s drawing: the tree, start offsets, durations, a bar per span, the span events."""

from __future__ import annotations

import pytest
from builders import allocated, job

from corral.libs.trace import derive
from corral.libs.trace.render import BAR, NAME, duration, render
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


def test_the_tree_shows_offsets_durations_bars_and_events() -> None:
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
    text = render(4, derive.spans(4, entries), now_ns=120 * 10**9)
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
