"""A job's span tree for the terminal: one line per span with its start offset, duration and a bar, and one
line per span event under it (``corral trace``).

    job 12: trace 0af7651916cd43dd8448eb211c80319c, 8 spans
    span                      start   duration  timeline
    submit                   +0.000s    0.000s  |▏                              |
    └─ job 12                +0.000s    3.214s  |███████████████████████████████|
       ├─ queued             +0.000s    0.412s  |████                           |
       ├─ attempt 0          +0.412s    2.700s  |    ███████████████████████████|
       │  · requeued +3.100s requeue.reason=NodeFail cause=NodeDown cause.node=node2 ...

Pure: strings in, strings out.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.libs.trace.spans import AttrValue, SpanRecord

#: Width of the timeline bar, in characters.
BAR = 32
#: Width of the tree column.
NAME = 34


def duration(ns: int) -> str:
    """A duration for people: ``0.412s``, ``12m03s``, ``3h02m``, ``4d05h``."""
    seconds = ns / 1e9
    if seconds < 60:
        return f"{seconds:.3f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _bar(start: int, end: int, origin: int, total: int) -> str:
    """The span's place on the timeline (at least one cell)."""
    if total <= 0:
        return "▏" + " " * (BAR - 1)
    first = min(BAR - 1, int((start - origin) * BAR / total))
    last = max(first + 1, min(BAR, round((end - origin) * BAR / total)))
    if end == start:
        return " " * first + "▏" + " " * (BAR - first - 1)
    return " " * first + "█" * (last - first) + " " * (BAR - last)


def _value(value: AttrValue) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    text = str(value)
    return f'"{text}"' if " " in text else text


def _event_attributes(attributes: dict[str, AttrValue]) -> str:
    shown = {
        k.removeprefix("corral."): v for k, v in attributes.items() if not k.endswith("event_id") and v != ""
    }
    return " ".join(f"{k}={_value(v)}" for k, v in shown.items())


def render(job_id: int, spans: Sequence[SpanRecord], now_ns: int) -> str:
    """The tree of ``spans`` (open spans run to ``now_ns``) as text lines, ending with a newline."""
    if not spans:
        return f"job {job_id}: no spans\n"
    ends = {s.span_id: s.end_ns if s.end_ns is not None else max(now_ns, s.start_ns) for s in spans}
    origin = min(s.start_ns for s in spans)
    total = max(ends.values()) - origin
    children: dict[str | None, list[SpanRecord]] = {}
    ids = {s.span_id for s in spans}
    for span in spans:
        parent = span.parent_id if span.parent_id in ids else None
        children.setdefault(parent, []).append(span)
    lines = [
        f"job {job_id}: trace {spans[0].trace_id}, {len(spans)} spans",
        f"{'span':<{NAME}} {'start':>9} {'duration':>9}  timeline",
    ]

    def walk(span: SpanRecord, prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└─ " if last else "├─ ")
        end = ends[span.span_id]
        open_mark = "…" if span.end_ns is None else ""
        status = " ✗" if span.status == "error" else ""
        name = f"{prefix}{branch}{span.name}{status}"
        if len(name) > NAME:
            name = name[: NAME - 1] + "…"
        lines.append(
            f"{name:<{NAME}} {'+' + duration(span.start_ns - origin):>9} "
            f"{duration(end - span.start_ns) + open_mark:>9}  |{_bar(span.start_ns, end, origin, total)}|"
        )
        inner = prefix if root else prefix + ("   " if last else "│  ")
        kids = sorted(children.get(span.span_id, []), key=lambda s: (s.start_ns, s.name))
        pipe = "│  " if kids else "   "
        for event in span.events:
            lines.append(
                f"{inner}{pipe}· {event.name} +{duration(event.time_ns - origin)} "
                f"{_event_attributes(event.attributes)}".rstrip()
            )
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    roots = sorted(children.get(None, []), key=lambda s: (s.start_ns, s.name))
    for root in roots:
        walk(root, "", True, True)
    return "\n".join(lines) + "\n"
