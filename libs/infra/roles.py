"""NATS roles: who may publish and subscribe where (DESIGN §8).

- users may only call the API, on their own subject token, and read their own reply inbox;
- an agent may only publish facts about its own node (its run facts carry the node in the
  subject; the fold ignores one about a run not on that node), heartbeat as its node and consume its
  node's work through the consumer the admin created for it (it may not create or change a consumer);
- only the scheduler may publish decisions and orders; only the gateway intents (admin node drain and
  resume included); only health node liveness and drain facts; the admin role may do anything (stream
  declaration, admin verbs);
- the tracer only reads the log (its own durable consumer) and publishes nothing but dead letters;
- the feed service reads the log and publishes the job event feed (``corral.feed.v1.>``) and nothing else;
  a reader of the feed (a person, the auditor, a service account) reads only the subjects of its
  ``FeedScope``, live (core subscribe) or through the durable consumer made for it (``feed_rights``): it may
  neither create nor change a consumer, since a consumer's body can make it deliver on any subject.
- no role but the admin has ``allow_responses``: that right lets a service publish on whatever reply subject a
  requester chose, with the service's rights (the log, the KV buckets, another node's heartbeat: a confused
  deputy). A role that answers requests may publish on the users' inboxes (``subjects.INBOXES``) instead,
  and ``api_server.serve`` answers only on the caller's own (``docs/security.md``);
- a service account (``svc-<name>``, ``service_account_user``) has a person's API rights under its own name
  (the gateway lets it submit on behalf of the users and accounts of its scope, ``libs/core/scopes.py``),
  and may publish health reports on its own reporter token (health checks the node is in its scope);
- the auth callout (``corral-auth``) answers nats-server's authorization requests for people who connect with
  a ticket (``services/auth``) and reads the revocation bucket; ``corral-system`` is the system account's
  user, which the revoke command uses to close a revoked user's connections;
- the auditor role is a person's account (the API only, ``auditor_user``) that the gateway's ``--auditor``
  lets read every job's history and refuses every verb that writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.libs.core import scopes
from corral.libs.infra import NatsUser
from corral.schemas import api, steps, subjects

ADMIN = "corral-admin"
GATEWAY = "corral-gateway"
SCHEDULER = "corral-scheduler"
HEALTH = "corral-health"
ACCOUNTING = "corral-accounting"
TRACER = "corral-tracer"
FEED = "corral-feed"
AUTH = "corral-auth"
#: The user of nats-server's system account (``$SYS``): closes a revoked user's connections (``KICK``).
SYSTEM = "corral-system"
#: The local cluster's auditor (``corral up`` passes it to the gateway's ``--auditor``).
AUDITOR = "corral-auditor"

#: Every service role (agents are per node: ``agent_role(node)``).
SERVICE_ROLES = (ADMIN, GATEWAY, SCHEDULER, HEALTH, ACCOUNTING, TRACER, FEED, AUTH)

_GATEWAY_EVENTS = (
    "job_submitted",
    "job_cancel_requested",
    "job_hold_requested",
    "job_release_requested",
    "job_update_requested",
    "job_requeue_requested",
    "job_signal_requested",
)
_GATEWAY_RESV_EVENTS = ("reservation_create_requested", "reservation_delete_requested")
_GATEWAY_NODE_EVENTS = ("node_drain_requested", "node_resume_requested", "node_down_requested")
_HEALTH_NODE_EVENTS = ("node_down", "node_up", "node_drained", "node_resumed")
_SCHEDULER_RESV_EVENTS = ("reservation_created", "reservation_rejected", "reservation_deleted")
_SCHEDULER_EVENTS = (
    "job_allocated",
    "job_completed",
    "job_failed",
    "job_cancelled",
    "job_requeued",
    "job_held",
    "job_released",
    "job_updated",
    "job_preempted",
    "job_reason_changed",
)

# JetStream API use of a service: stream/consumer info, consumers, direct gets, acks, flow control.
_JS_CLIENT = [
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.STREAM.MSG.GET.*",
    "$JS.API.DIRECT.GET.>",
    "$JS.API.CONSUMER.>",
    "$JS.ACK.>",
    "$JS.FC.>",
]


def _verbs(service: str) -> list[str]:
    """Request subjects of the API verbs ``service`` answers (``api.VERBS``), from any user."""
    return [subjects.api_subject(verb, "*") for verb, answerer in api.VERBS.items() if answerer == service]


def agent_role(node: str) -> str:
    """NATS user name of a node's agent."""
    return f"agent-{node}"


def _inbox(user: str) -> str:
    return f"{subjects.inbox_prefix(user)}.>"


#: The work stream's consumer API and acks: only the admin (who declares each node's consumer) and each node's
#: agent (bound to its own) use them. A service's JetStream client rights (``$JS.API.CONSUMER.>``, for its
#: own consumers of the log and the buckets) would otherwise let it create a consumer there and read launch
#: orders, which hold users' scripts and environments.
_WORK_CONSUMERS = (
    f"$JS.API.CONSUMER.*.{subjects.WORK_STREAM}",
    f"$JS.API.CONSUMER.*.{subjects.WORK_STREAM}.>",
    f"$JS.API.CONSUMER.*.*.{subjects.WORK_STREAM}.>",
    f"$JS.ACK.{subjects.WORK_STREAM}.>",
)


def service_user(role: str, password: str) -> NatsUser:
    """The NATS user of a service role."""
    if role == ADMIN:
        return NatsUser(role, password, publish=[">"], subscribe=[">"], allow_responses=True)
    publish: list[str] = [*_JS_CLIENT, subjects.DLQ_SUBJECTS]
    subscribe = [_inbox(role)]
    if role == GATEWAY:
        publish += [subjects.job_subject("*", tag) for tag in _GATEWAY_EVENTS]
        publish += [subjects.resv_subject("*", tag) for tag in _GATEWAY_RESV_EVENTS]
        publish += [subjects.node_subject("*", tag) for tag in _GATEWAY_NODE_EVENTS]
        publish += [f"$KV.{subjects.IDS_BUCKET}.>", f"$JS.API.STREAM.INFO.KV_{subjects.IDS_BUCKET}"]
        subscribe += _verbs("gateway")
        publish.append(subjects.INBOXES)
        # How many live jobs the user has (the scheduler's count), to enforce MaxSubmitJobs; sbatch
        # --test-only's estimate.
        publish += [subjects.api_subject("live_counts", GATEWAY), subjects.api_subject("will_run", GATEWAY)]
    elif role == SCHEDULER:
        publish += [subjects.job_subject("*", tag) for tag in _SCHEDULER_EVENTS]
        publish += [subjects.resv_subject("*", tag) for tag in _SCHEDULER_RESV_EVENTS]
        publish += [subjects.WORK_SUBJECTS, f"$O.{subjects.SNAPSHOT_BUCKET}.>"]
        publish += [f"$JS.API.STREAM.PURGE.OBJ_{subjects.SNAPSHOT_BUCKET}"]
        # The leader lease and the schedulers' presence (compare-and-set writes, reads by direct get).
        publish += [f"$KV.{subjects.LEADER_BUCKET}.>", f"$JS.API.STREAM.INFO.KV_{subjects.LEADER_BUCKET}"]
        subscribe += _verbs("scheduler")
        publish.append(subjects.INBOXES)
    elif role == HEALTH:
        publish += [subjects.node_subject("*", tag) for tag in _HEALTH_NODE_EVENTS]
        subscribe += [subjects.heartbeat_subject("*"), subjects.HEALTH_REPORTS]
        publish += [subjects.node_subject("*", "node_health_reported")]
    elif role == ACCOUNTING:
        subscribe += _verbs("accounting")
        publish.append(subjects.INBOXES)
        # The partition leases and the accounting processes' presence, in the leader bucket.
        publish += [f"$KV.{subjects.LEADER_BUCKET}.>", f"$JS.API.STREAM.INFO.KV_{subjects.LEADER_BUCKET}"]
    elif role == AUTH:
        # nats-server's authorization requests, answered on the server's own $SYS inbox; reads of the
        # revocations bucket, and no other JetStream API (no consumer of the log: it holds scripts).
        subscribe.append("$SYS.REQ.USER.AUTH")
        revoked = f"KV_{subjects.REVOKED_BUCKET}"
        publish = [subjects.DLQ_SUBJECTS, "$SYS._INBOX.>", "$JS.API.INFO", f"$JS.API.STREAM.INFO.{revoked}"]
        publish += [f"$JS.API.STREAM.MSG.GET.{revoked}", f"$JS.API.DIRECT.GET.{revoked}.>"]
    elif role == TRACER:
        pass  # read-only: the JetStream client API of its consumer, and dead letters
    elif role == FEED:
        publish.append(
            subjects.FEED_SUBJECTS
        )  # the feed, and its readers' consumers (``$JS.API.CONSUMER.>``)
    else:
        raise ValueError(f"unknown service role {role!r}")
    return NatsUser(role, password, publish=publish, subscribe=subscribe, deny_publish=_WORK_CONSUMERS)


def agent_user(node: str, password: str) -> NatsUser:
    """The NATS user of one node's agent: facts about its own node only."""
    role = agent_role(node)
    durable = f"{subjects.WORK_STREAM}.{subjects.work_consumer(node)}"
    publish = [
        subjects.node_subject(node, "node_registered"),
        f"corral.evt.job.*.run_started.{node}",
        f"corral.evt.job.*.run_exited.{node}",
        f"corral.evt.step.*.step_started.{node}",
        f"corral.evt.step.*.step_exited.{node}",
        # Steps (srun): asking peer agents as itself, and the output and exits of its own node's tasks.
        steps.step_subject("*", role),
        *(steps.io_subject("*", "*", kind, "*", node) for kind in ("out", "err", "exit")),
        # Answers to step requests, on the caller's inbox (``step_server`` checks it is the caller's own).
        subjects.INBOXES,
        subjects.heartbeat_subject(node),
        # Its health-check program's reports about its own node (health checks the reporter token too).
        subjects.health_report_subject(role, node),
        subjects.DLQ_SUBJECTS,
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.*",
        # Its work consumer, which the admin created filtered on its node's orders: read, never create or
        # change it (a consumer it could re-point at corral.work.<other> would hand it another node's orders).
        f"$JS.API.CONSUMER.INFO.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{durable}",
        f"$JS.ACK.{durable}.>",
    ]
    # Step requests to this node from anyone (the agent checks the caller), the stdin of its own node's
    # task 0s, and task exits (the batch node of a step collects its peers').
    subscribe = [
        _inbox(role),
        steps.step_subject(node, "*"),
        steps.io_subject("*", "*", "in", None, node),
        steps.io_subject("*", "*", "exit", "*", "*"),
    ]
    return NatsUser(role, password, publish=publish, subscribe=subscribe)


def auditor_user(password: str) -> NatsUser:
    """The NATS user of the auditor role: a person's permissions (the API only) and the whole feed; what it
    may read or change is the gateway's rule (``--auditor``)."""
    return _person(AUDITOR, password, FeedScope(everyone=True))


def user_user(name: str, password: str) -> NatsUser:
    """The NATS user of a person: the API on their own subject token, replies on their own inbox."""
    return _person(person_name(name), password)


def person_name(name: str) -> str:
    """``name`` if a person may have it; ValueError otherwise (not a subject token, or a service's)."""
    if not subjects.valid_token(name):
        raise ValueError(f"user name {name!r} cannot be a subject token (letters, digits, - _)")
    if name.startswith(("agent-", "corral-", scopes.PREFIX)):
        raise ValueError(f"user name {name!r} is reserved for Corral's services")
    return name


def service_account_user(sa: scopes.ServiceAccount, password: str) -> NatsUser:
    """The NATS user of a service account: a person's API rights as ``svc-<name>`` (the gateway applies its
    submit scope) and, with a report-health scope, health reports on its own reporter token. The node token
    is not narrowed here: health checks it against the scope, so that a report about another node is
    dead-lettered with its reason and counted rather than lost in the server's permission log."""
    user = _person(sa.login, password, service_account_feed(sa) or FeedScope())
    reports = [subjects.health_report_subject(sa.login, "*")] if sa.report_nodes else []
    return NatsUser(user.user, password, publish=[*user.publish, *reports], subscribe=user.subscribe)


def _person(name: str, password: str, scope: FeedScope | None = None) -> NatsUser:
    publish, subscribe = person_permissions(name, scope)
    return NatsUser(name, password, publish=publish, subscribe=subscribe)


def person_permissions(name: str, scope: FeedScope | None = None) -> tuple[list[str], list[str]]:
    """What a person may publish and subscribe to: a static user's, and the auth callout's user JWTs; the
    feed of ``scope`` (default: the person's own jobs)."""
    # The API and steps (srun) as themselves; their steps' output, and stdin to their steps' task 0.
    publish = [
        subjects.api_subject("*", name),
        steps.step_subject("*", name),
        steps.io_subject(name, "*", "in", None, "*"),
    ]
    subscribe = [_inbox(name), f"corral.io.{name}.>"]
    feed_publish, feed_subscribe = feed_rights(name, scope or FeedScope(users=(name,)))
    return publish + feed_publish, subscribe + feed_subscribe


@dataclass(frozen=True)
class FeedScope:
    """Whose jobs a reader of the feed sees: a person their own (``users=(name,)``), the auditor and the admin
    every job (``everyone``), a service account the users and accounts it is allowed."""

    users: tuple[str, ...] = ()  # the jobs of these users
    accounts: tuple[str, ...] = ()  # and the jobs of these accounts
    everyone: bool = False  # every job

    def filters(self) -> list[str]:
        """The feed subjects of the scope's jobs (the filters of its consumer, ``streams.feed_reader``)."""
        if self.everyone:
            return [subjects.FEED_SUBJECTS]
        return [subjects.feed_user_filter(u) for u in self.users] + [
            subjects.feed_account_filter(a) for a in self.accounts
        ]


def feed_rights(name: str, scope: FeedScope) -> tuple[list[str], list[str]]:
    """(publish, subscribe) rights of ``name`` on the feed: its scope's subjects and every node's, live; and
    the JetStream API of its own consumer ``feed-<name>`` only: its info, the next messages, acks and flow
    control. No ``CONSUMER.CREATE``: a consumer's body may set a deliver subject, and the server delivers
    there with its own rights, so a reader could make it publish on the log or on a node's heartbeat."""
    durable = f"{subjects.FEED_STREAM}.{subjects.feed_consumer(name)}"
    publish = [
        "$JS.API.INFO",
        f"$JS.API.CONSUMER.INFO.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{durable}",
        f"$JS.ACK.{durable}.>",
    ]
    subscribe = scope.filters() if scope.everyone else [*scope.filters(), subjects.FEED_NODES]
    return publish, subscribe


def service_account_feed(sa: scopes.ServiceAccount) -> FeedScope | None:
    """The feed a service account with ``read_feed`` reads: the jobs of the users and accounts it may submit
    for (None: it reads no job of the feed)."""
    return FeedScope(users=sa.submit_users, accounts=sa.submit_accounts) if sa.read_feed else None


def feed_readers(service_accounts: tuple[scopes.ServiceAccount, ...] = ()) -> dict[str, list[str]]:
    """The feed consumers the declaration makes (``streams.declare``): the auditor's, every job, and each
    service account's that reads the feed; the feed service makes each person's when it first meets them."""
    readers = {AUDITOR: FeedScope(everyone=True).filters()}
    for sa in service_accounts:
        if (scope := service_account_feed(sa)) is not None:
            readers[sa.login] = scope.filters()
    return readers
