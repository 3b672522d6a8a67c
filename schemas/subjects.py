"""Subjects and stream names: the one place that spells them.

- ``corral.evt.job.<id>.<tag>``: job intents (gateway) and decisions (scheduler);
- ``corral.evt.job.<id>.<tag>.<node>``: run facts, named by the reporting node so that NATS
  permissions can confine an agent to facts about its own node;
- ``corral.evt.node.<node>.<tag>``: node facts (agent registration, health) and admin intents (drain, resume);
- ``corral.evt.resv.<name>.<tag>``: advance reservations: intents (gateway) and decisions (scheduler);
- ``corral.evt.step.<job>.<tag>.<node>``: job step facts (srun), by the job's batch node; not under the
  job's subjects, so they never make a scheduler decision's expected last sequence stale;
- ``corral.step.<node>.<caller>`` and ``corral.io.<user>.<key>.>``: step requests and I/O (core NATS,
  ``corral.schemas.steps``);
- ``corral.work.<node>``: per-node orders (launch, kill) in their own stream;
- ``corral.hb.<node>``: heartbeats (core NATS, not persisted);
- ``corral.api.v1.<verb>.<user>``: request/reply API; the last token is the caller's user name,
  which the NATS server's permissions bind to the authenticated connection;
- ``corral.ext.health.<reporter>.<node>``: health reports from outside the log (core NATS): a DCGM-style
  exporter's (a service account) or an agent's health-check program; the reporter token is bound to the
  connection by the permissions, as the API's user token is, and health checks it may report the node;
- ``corral.dlq.<service>``: dead letters (rejected asynchronous input) in their own stream;
- ``_INBOX.<user>.>``: the reply inbox of one user or role (``inbox_prefix``); a service answers a request
  only on the caller's own inbox (``own_inbox``), never on a subject the requester chose elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from corral.schemas import events as ev

EVENTS_STREAM = "CORRAL_EVENTS"
EVENTS_SUBJECTS = "corral.evt.>"
WORK_STREAM = "CORRAL_WORK"
WORK_SUBJECTS = "corral.work.>"
DLQ_STREAM = "CORRAL_DLQ"
DLQ_SUBJECTS = "corral.dlq.>"
IDS_BUCKET = "corral_ids"
#: Users whose tickets the auth callout refuses (``corral credentials revoke``): key = user name.
REVOKED_BUCKET = "corral_revoked"
SNAPSHOT_BUCKET = "corral_snapshots"
JOB_ID_KEY = "job_id"
#: The schedulers' leader bucket: the lease (``LEASE_KEY``) and each scheduler's presence (``member_key``).
LEADER_BUCKET = "corral_leader"
LEASE_KEY = "lease"

API_PREFIX = "corral.api.v1"

#: A subject token: what a node or user name may contain to be used in a subject.
_TOKEN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,63}$")


def valid_token(name: str) -> bool:
    """True if ``name`` can be one subject token (node and user names must be)."""
    return bool(_TOKEN.match(name))


def member_key(name: str) -> str:
    """The leader bucket's key of one scheduler's presence (``scontrol ping``)."""
    return f"member.{name}"


def job_subject(job_id: int | str, tag: str, node: str | None = None) -> str:
    """Subject of a job event; run facts carry the reporting node as a last token."""
    base = f"corral.evt.job.{job_id}.{tag}"
    return f"{base}.{node}" if node is not None else base


def job_events(job_id: int) -> str:
    """Wildcard for every event of one job."""
    return f"corral.evt.job.{job_id}.>"


def step_events(job_id: int) -> str:
    """Wildcard for every step fact of one job."""
    return f"corral.evt.step.{job_id}.>"


def node_events(node: str) -> str:
    """Wildcard for every event of one node."""
    return f"corral.evt.node.{node}.>"


def node_subject(node: str, tag: str) -> str:
    """Subject of a node event."""
    return f"corral.evt.node.{node}.{tag}"


def resv_subject(name: str, tag: str) -> str:
    """Subject of a reservation event."""
    return f"corral.evt.resv.{name}.{tag}"


def resv_events(name: str) -> str:
    """Wildcard for every event of one reservation."""
    return f"corral.evt.resv.{name}.>"


def event_subject(body: ev.Event) -> str:
    """The one subject an event belongs on; consumers check messages against it."""
    kind = type(body)
    rule = _SUBJECT_RULES.get(kind) or _subject_rule(kind)
    return rule(body)


#: How ``event_subject`` names each event type's subject, decided once per type (every reader checks every
#: entry against it: isinstance checks per entry were a tenth of a rebuild's time).
_SUBJECT_RULES: dict[type, Callable[[Any], str]] = {}


def _subject_rule(kind: type) -> Callable[[Any], str]:
    tag = kind.__struct_config__.tag  # type: ignore[attr-defined]
    assert isinstance(tag, str)
    rule: Callable[[Any], str]
    if issubclass(kind, ev.RunStarted | ev.RunExited):
        rule = lambda body: f"corral.evt.job.{body.job_id}.{tag}.{body.node}"  # noqa: E731
    elif issubclass(kind, ev.NODE_EVENTS):
        rule = lambda body: f"corral.evt.node.{body.node}.{tag}"  # noqa: E731
    elif issubclass(kind, ev.StepStarted | ev.StepExited):
        rule = lambda body: f"corral.evt.step.{body.job_id}.{tag}.{body.node}"  # noqa: E731
    elif issubclass(kind, ev.RESERVATION_EVENTS):
        rule = lambda body: f"corral.evt.resv.{body.name}.{tag}"  # noqa: E731
    else:
        rule = lambda body: f"corral.evt.job.{body.job_id}.{tag}"  # noqa: E731
    _SUBJECT_RULES[kind] = rule
    return rule


#: The kinds of log subjects whose entries move one owner's sequence (the conditional appends' subjects).
OWNED = {"job": "corral.evt.job", "node": "corral.evt.node", "resv": "corral.evt.resv"}


def entry_owner(subject: str) -> tuple[str, str] | None:
    """(kind, name) of the job, node or reservation whose subjects ``subject`` is on (``job_events``,
    ``node_events``, ``resv_events``), whatever the entry holds; None for any other subject.

    A conditional append expects the newest sequence over the owner's wildcard, so every entry there counts,
    one that fails to decode or whose body claims another owner included (``fold.skip``)."""
    parts = subject.split(".")
    if len(parts) < 5:
        return None
    for kind, prefix in OWNED.items():
        if ".".join(parts[:3]) == prefix:
            if kind == "job" and not parts[3].isdigit():
                return None
            return kind, parts[3]
    return None


def work_subject(node: str) -> str:
    """Per-node order subject."""
    return f"corral.work.{node}"


def work_consumer(node: str) -> str:
    """The durable consumer of a node's orders on the work stream: the admin creates it, filtered on the
    node's own ``work_subject`` (``streams.declare``); its agent only binds to it."""
    return f"agent-{node}"


def heartbeat_subject(node: str) -> str:
    """Heartbeat subject of one node."""
    return f"corral.hb.{node}"


def api_subject(verb: str, user: str) -> str:
    """Request subject of an API verb called by ``user``."""
    return f"{API_PREFIX}.{verb}.{user}"


def api_caller(subject: str) -> tuple[str, str]:
    """(verb, user) of an API request subject; ValueError if it is not one."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:3]) != API_PREFIX:
        raise ValueError(f"not an API subject: {subject!r}")
    return parts[3], parts[4]


HEALTH_REPORT_PREFIX = "corral.ext.health"
#: What health subscribes to: every reporter's reports about every node.
HEALTH_REPORTS = f"{HEALTH_REPORT_PREFIX}.*.*"


def health_report_subject(reporter: str, node: str) -> str:
    """Where ``reporter`` (a service account's or an agent's NATS user) publishes a report about ``node``."""
    return f"{HEALTH_REPORT_PREFIX}.{reporter}.{node}"


def health_report_of(subject: str) -> tuple[str, str]:
    """(reporter, node) of a health report subject; ValueError if it is not one."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:3]) != HEALTH_REPORT_PREFIX:
        raise ValueError(f"not a health report subject: {subject!r}")
    return parts[3], parts[4]


def dlq_subject(service: str) -> str:
    """Dead-letter subject of a service."""
    return f"corral.dlq.{service}"


#: Every user's reply inbox: what a service that answers requests may publish (``own_inbox`` narrows it).
INBOXES = "_INBOX.*.>"


def inbox_prefix(user: str) -> str:
    """Per-user reply inbox prefix, so a user can only read replies addressed to them (the user is a token
    of its own, so that the permissions can name every user's inbox at once: ``INBOXES``)."""
    return f"_INBOX.{user}"


def own_inbox(user: str, reply: str) -> bool:
    """True if ``reply`` is under ``user``'s own inbox: the only reply subject a service answers a request of
    ``user`` on. Any other one is a confused-deputy attempt: the requester chose where the service, with its
    own rights, would publish (the log, a KV bucket, another node's heartbeat)."""
    return reply.startswith(f"{inbox_prefix(user)}.") and valid_token(user)


# --- the job event feed (``schemas/feed.py``) -------------------------------------------------------------

#: The feed: a versioned projection of the log for subscribers, by user (``services/feed``).
FEED_STREAM = "CORRAL_FEED"
FEED_VERSION = "v1"
FEED_PREFIX = f"corral.feed.{FEED_VERSION}"
FEED_SUBJECTS = f"{FEED_PREFIX}.>"
#: The account token of a job with no account, or with one that cannot be a subject token.
NO_ACCOUNT = "_"


def feed_job_subject(account: str | None, user: str, job_id: int, kind: str) -> str:
    """``corral.feed.v1.job.<account>.<user>.<id>.<kind>``: the account and the user are tokens of their own,
    so that one consumer filter names a person's jobs (``feed_user_filter``) or an account's."""
    token = account if account and valid_token(account) else NO_ACCOUNT
    return f"{FEED_PREFIX}.job.{token}.{user}.{job_id}.{kind}"


def feed_user_filter(user: str) -> str:
    """Every feed subject of ``user``'s jobs."""
    return f"{FEED_PREFIX}.job.*.{user}.>"


def feed_account_filter(account: str) -> str:
    """Every feed subject of the jobs of ``account``."""
    return f"{FEED_PREFIX}.job.{account}.>"


def feed_node_subject(node: str, kind: str) -> str:
    """``corral.feed.v1.node.<node>.<kind>``: a node's state changes, which every user may read (sinfo)."""
    return f"{FEED_PREFIX}.node.{node}.{kind}"


#: Every node's feed subjects.
FEED_NODES = f"{FEED_PREFIX}.node.>"


def feed_consumer(name: str) -> str:
    """The durable consumer of the feed that one user or role reads: ``feed-<name>``, created for it by the
    feed service or the admin with its filters pinned (a reader may not create consumers:
    ``docs/integrations.md``)."""
    return f"feed-{name}"
