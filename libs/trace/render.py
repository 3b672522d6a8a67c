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

import textwrap
from collections.abc import Sequence

from corral.libs.trace.spans import AttrValue, SpanRecord

#: Width of the timeline bar, in characters.
BAR = 32
#: Width of the tree column.
NAME = 34
#: The narrowest timeline bar of a ``width``-bound tree.
MIN_BAR = 10
#: The columns of a span's line besides its name and its bar: start, duration, spaces and the bar's ends.
FIXED = 1 + 9 + 1 + 9 + 2 + 2


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


def _bar(start: int, end: int, origin: int, total: int, bar: int = BAR) -> str:
    """The span's place on a timeline ``bar`` cells wide (at least one cell)."""
    if total <= 0:
        return "▏" + " " * (bar - 1)
    first = min(bar - 1, int((start - origin) * bar / total))
    last = max(first + 1, min(bar, round((end - origin) * bar / total)))
    if end == start:
        return " " * first + "▏" + " " * (bar - first - 1)
    return " " * first + "█" * (last - first) + " " * (bar - last)


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


def render(job_id: int, spans: Sequence[SpanRecord], now_ns: int, width: int | None = None) -> str:
    """The tree of ``spans`` (open spans run to ``now_ns``) as text lines, ending with a newline; ``width``
    (a terminal's columns) narrows the tree column to its longest name, the timeline to what is left (at
    least MIN_BAR cells) and wraps the span events' lines, None keeps the fixed layout (NAME, BAR)."""
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
    rows: list[tuple[str, SpanRecord | None, str]] = []  # (tree name, its span; or an event's indent, text)

    def walk(span: SpanRecord, prefix: str, last: bool, root: bool) -> None:
        branch = "" if root else ("└─ " if last else "├─ ")
        rows.append((f"{prefix}{branch}{span.name}{' ✗' if span.status == 'error' else ''}", span, ""))
        inner = prefix if root else prefix + ("   " if last else "│  ")
        kids = sorted(children.get(span.span_id, []), key=lambda s: (s.start_ns, s.name))
        pipe = "│  " if kids else "   "
        for event in span.events:
            text = f"· {event.name} +{duration(event.time_ns - origin)} {_event_attributes(event.attributes)}"
            rows.append((f"{inner}{pipe}", None, text.rstrip()))
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for root in sorted(children.get(None, []), key=lambda s: (s.start_ns, s.name)):
        walk(root, "", True, True)
    name_width, bar = NAME, BAR
    if width is not None:
        name_width = min(NAME, max(len(name) for name, record, _ in rows if record is not None))
        bar = max(MIN_BAR, width - name_width - FIXED)
    lines = [
        f"job {job_id}: trace {spans[0].trace_id}, {len(spans)} spans",
        f"{'span':<{name_width}} {'start':>9} {'duration':>9}  timeline",
    ]
    for name, record, text in rows:
        if record is None:
            lines += _wrapped(name, text, width)
            continue
        if len(name) > name_width:
            name = name[: name_width - 1] + "…"
        end = ends[record.span_id]
        open_mark = "…" if record.end_ns is None else ""
        lines.append(
            f"{name:<{name_width}} {'+' + duration(record.start_ns - origin):>9} "
            f"{duration(end - record.start_ns) + open_mark:>9}  "
            f"|{_bar(record.start_ns, end, origin, total, bar)}|"
        )
    return "\n".join(lines) + "\n"


def _wrapped(indent: str, text: str, width: int | None) -> list[str]:
    """A span event's line under the tree's ``indent``; within ``width`` columns if given, its attributes
    continued under the event's name."""
    if width is None or len(indent) + len(text) <= width:
        return [indent + text]
    return textwrap.wrap(
        text, width, initial_indent=indent, subsequent_indent=indent + "  ", break_on_hyphens=False
    )
