"""How ``corral audit`` shows a history: one line per event, pure (no IO, no clock; the time zone is given).

Modelled on Flux's ``flux job eventlog`` (a timestamp, the event's name, then ``key=value`` context), with
the two things an audit asks on top: who (the actor) and why (the causation chain, last)::

    2026-12-01T23:20:30.151  job_submitted  alice             name=t.sh user=alice nodes=2
    2026-12-01T23:20:30.412  job_allocated  corral-scheduler  attempt=0 nodes=node[1-2]  ← job_submitted
    2026-12-01T23:21:02.007  job_requeued   corral-scheduler  attempt=0 reason=NodeFail  ← node_down node2 ...

(the last one ends ``← node_down node2 (Not responding)  ← missed heartbeats``);

- the actor is the authenticated identity: the user for the gateway's intents (the gateway takes it from
  the connection, never from the request), the service account for a job it submitted on a user's behalf
  (``on_behalf_of=<user>``), else the writer's role (``Meta.actor``);
- what changed is the body's fields that say something (defaults, the job id and bulky specs left out);
- why follows ``Meta.causation_id`` through the history and the reply's ``causes``; a ``NodeDown`` with no
  cause and no admin is missed heartbeats. A cause the reply does not hold is shown by its event id.

``--json`` gives the same as data, with each entry's envelope (``as_json``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import msgspec

from corral.libs.core import scopes
from corral.libs.slurm import hostlist
from corral.libs.slurm.timefmt import format_time_limit
from corral.schemas import api, lifecycle
from corral.schemas import events as ev

#: How far a causation chain is followed (a chain in the log is a few steps; this guards a cycle).
MAX_CHAIN = 8
#: The last word of a chain whose first cause is a node that stopped heartbeating.
MISSED_HEARTBEATS = "missed heartbeats"
#: Fields never shown in "what": the job id (the history is the job's) and the leader's fencing epoch.
_HIDDEN = frozenset({"job_id", "epoch", "request_id"})


@dataclass(frozen=True)
class Line:
    """One event of a history as ``corral audit`` shows it."""

    seq: int  # its place in the log
    time: float  # when it happened (Unix seconds)
    event: str  # its tag (``job_requeued``)
    job_id: int | None  # the job it is about, None for a node's or a reservation's
    actor: str  # who: the user of an intent, else the writer's role
    what: dict[str, str]  # what it says, field by field
    why: list[str]  # its causes, nearest first


def lines(reply: api.HistoryReply) -> list[Line]:
    """The reply's entries as lines, in log order."""
    known = {e.envelope.meta.event_id: e.envelope for e in [*reply.entries, *reply.causes]}
    return [_line(e.seq, e.envelope, known) for e in reply.entries]


def render(reply: api.HistoryReply, tz: dt.tzinfo | None = None, jobs: bool = False) -> str:
    """The text of ``corral audit``: one line per event, its causes last; ``tz`` is the time zone of the
    times (None: the local one); ``jobs`` shows each line's job id (for a node's or a user's history)."""
    rows = lines(reply)
    if not rows:
        return ""
    event_width = max(len(r.event) for r in rows)
    actor_width = max(len(r.actor) for r in rows)
    out = []
    for row in rows:
        when = dt.datetime.fromtimestamp(row.time, tz).isoformat(timespec="milliseconds")
        job = f"{row.job_id if row.job_id is not None else '-':>8}  " if jobs else ""
        what = " ".join(f"{k}={_quoted(v)}" for k, v in row.what.items())
        why = "".join(f"  ← {cause}" for cause in row.why)
        out.append(
            f"{when[:23]}  {job}{row.event:<{event_width}}  {row.actor:<{actor_width}}  {what}{why}".rstrip()
        )
    if reply.truncated:
        out.append("(older entries left out: ask for fewer jobs, or a larger --limit)")
    return "\n".join(out) + "\n"


def as_json(reply: api.HistoryReply) -> bytes:
    """``corral audit --json``: each line's fields and its entry's envelope, and whether entries were left
    out."""
    rows = lines(reply)
    entries = [
        {
            "seq": row.seq,
            "time": row.time,
            "event": row.event,
            "job_id": row.job_id,
            "actor": row.actor,
            "what": row.what,
            "why": row.why,
            "envelope": entry.envelope,
        }
        for row, entry in zip(rows, reply.entries, strict=True)
    ]
    return msgspec.json.encode({"entries": entries, "truncated": reply.truncated}) + b"\n"


def _line(seq: int, env: ev.Envelope, known: dict[str, ev.Envelope]) -> Line:
    body = env.body
    return Line(
        seq=seq,
        time=env.meta.occurred_at,
        event=_tag(body),
        job_id=getattr(body, "job_id", None),
        actor=actor_of(env),
        what=what_of(body),
        why=why_of(env, known),
    )


def actor_of(env: ev.Envelope) -> str:
    """The authenticated identity behind an entry: the user for the gateway's intents, else the writer."""
    user = getattr(env.body, "user", None)
    if isinstance(env.body, ev.JobSubmitted) and env.body.service_account:
        return scopes.login(env.body.service_account)  # it submitted for the owner (``on_behalf_of=``)
    if lifecycle.WRITERS.get(type(env.body)) == "gateway" and isinstance(user, str):
        return user
    return env.meta.actor


def what_of(body: ev.Event) -> dict[str, str]:
    """The fields of an event that say something, as text."""
    if isinstance(body, ev.JobSubmitted):
        return _submitted(body)
    if isinstance(body, ev.JobAllocated):
        return _allocated(body)
    out: dict[str, str] = {}
    for field in msgspec.structs.fields(body):
        value = getattr(body, field.name)
        if field.name in _HIDDEN or value == field.default or value is None:
            continue
        if isinstance(body, ev.StepExited) and field.name == "tasks":
            out.update(_task_outcomes(body.tasks))
            continue
        out[field.name] = _text(value)
    return out


def _task_outcomes(tasks: list[ev.TaskOutcome]) -> dict[str, str]:
    """A step's tasks as ``rank@node=exit:signal`` (sacct's ExitCode; ``(oom)`` after one the OOM killer
    ended), and the errors of those that have one apart (their pids and clocks are left to ``--json``)."""
    shown = [f"{t.rank}@{t.node}={t.exit_code}:{t.signal}{'(oom)' if t.oom else ''}" for t in tasks]
    out = {"tasks": ",".join(shown)}
    errors = "; ".join(f"{t.rank}: {t.error}" for t in tasks if t.error)
    if errors:
        out["task_errors"] = errors
    return out


def why_of(env: ev.Envelope, known: dict[str, ev.Envelope]) -> list[str]:
    """The labels of an entry's causes, nearest first (``missed heartbeats`` ends a node's down)."""
    chain: list[str] = []
    cause = env.meta.causation_id
    last: ev.Envelope | None = env
    while cause is not None and len(chain) < MAX_CHAIN:
        found = known.get(cause)
        if found is None:
            chain.append(f"event {cause}")
            return chain
        chain.append(label(found.body, getattr(env.body, "job_id", None)))
        last, cause = found, found.meta.causation_id
    if last is not None and isinstance(last.body, ev.NodeDown) and not last.body.by and cause is None:
        chain.append(MISSED_HEARTBEATS)
    return chain


def label(body: ev.Event, job_id: int | None = None) -> str:
    """An event in a few words: its tag, the node or (another) job it is about, the reason, who asked."""
    words = [_tag(body)]
    node = getattr(body, "node", None)
    other_job = getattr(body, "job_id", None)
    if other_job is not None and other_job != job_id:
        words.append(str(other_job))
    if node is not None:
        words.append(str(node))
    reason = getattr(body, "reason", None)
    if isinstance(body, ev.NODE_EVENTS) and reason:
        words.append(f"({reason})")
    elif isinstance(reason, str) and reason:
        words.append(reason)
    who = getattr(body, "user", None) or getattr(body, "by", None)
    if isinstance(who, str) and who:
        words.append(f"by {who}")
    return " ".join(words)


def _submitted(body: ev.JobSubmitted) -> dict[str, str]:
    spec = body.spec
    out = {"name": spec.name, "user": body.user}
    if body.service_account:
        out["on_behalf_of"] = body.user
    for key, value in (
        ("account", spec.account),
        ("partition", spec.partition),
        ("qos", spec.qos),
        ("nodes", spec.nodes),
        ("ntasks", spec.ntasks),
    ):
        if value is not None:
            out[key] = str(value)
    if spec.gpus_per_node:
        out["gres"] = f"gpu:{spec.gpu_type + ':' if spec.gpu_type else ''}{spec.gpus_per_node}"
    if spec.time_limit_s is not None:
        out["time_limit"] = format_time_limit(spec.time_limit_s)
    if spec.array is not None:
        out["array"] = _text(msgspec.to_builtins(spec.array))
    return out


def _allocated(body: ev.JobAllocated) -> dict[str, str]:
    out = {
        "attempt": str(body.attempt),
        "partition": body.partition,
        "nodes": hostlist.compress(a.node for a in body.allocations),
    }
    gpus = [f"{a.node}:{','.join(map(str, a.gpus))}" for a in body.allocations if a.gpus]
    if gpus:
        out["gpus"] = " ".join(gpus)
    if body.time_limit_s is not None:
        out["time_limit"] = format_time_limit(body.time_limit_s)
    return out


def _tag(body: ev.Event) -> str:
    tag = type(body).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, msgspec.Struct):
        return _text(msgspec.to_builtins(value))
    return str(value)


def _quoted(value: str) -> str:
    """A value as ``key=value`` shows it: quoted if it has a space (Flux's eventlog does so too)."""
    return f'"{value}"' if " " in value or not value else value
