"""Where Corral's JetStream state is declared, in one place, and how a role connects.

- ``declare`` creates or updates the three streams (the log, the work queues, the dead letters), the
  job-id bucket, the schedulers' leader bucket, the snapshot store and each node's durable work consumer,
  filtered on that node's orders (``work_consumer``: idempotent; the admin role runs it). An agent may not
  create or change a consumer: it binds to its own, so it cannot read another node's launch orders (another
  user's script and environment);
- ``connect`` opens a role's connection, replies to its own inbox prefix, reconnecting for ever (nats-py
  sends its subscriptions again on each reconnection); its events are logged one line each by a
  ``nats_link.Link``, which also tells the loops that watch it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.nats_link import Link
from corral.schemas import subjects

#: How long the feed keeps a message.
FEED_MAX_AGE_S = 30 * 24 * 3600.0
#: How long a retry with the same Nats-Msg-Id is recognised as a duplicate.
DUPLICATE_WINDOW_S = 24 * 3600.0
#: How long the work stream keeps an order, delivered and acked or not: the longest a copy of an order can
#: still reach its agent after it was published (the agents' run records outlive it: agent/records.py).
WORK_MAX_AGE_S = 7 * 24 * 3600.0


def work_consumer(node: str) -> api.ConsumerConfig:
    """The durable consumer of one node's orders: only ``corral.work.<node>`` (the filter is the admin's)."""
    return api.ConsumerConfig(
        durable_name=subjects.work_consumer(node),
        filter_subject=subjects.work_subject(node),
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=60.0,
        max_ack_pending=10_000,
    )


def feed_reader(name: str, filters: Sequence[str]) -> api.ConsumerConfig:
    """The durable consumer of the feed that ``name`` reads (``feed-<name>``), filtered on ``filters`` (its
    ``roles.FeedScope``). A reader may not create or change a consumer (its body could make it a push
    consumer delivering on any subject: ``docs/integrations.md``): the feed service creates each person's as
    it meets them, the admin the others' (``declare``)."""
    config = api.ConsumerConfig(
        durable_name=subjects.feed_consumer(name),
        deliver_policy=api.DeliverPolicy.ALL,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=30.0,
        max_ack_pending=1000,
    )
    if len(filters) == 1:
        config.filter_subject = filters[0]
    else:
        config.filter_subjects = list(filters)
    return config


#: Consumers a stream may have. nats-server 2.15 limits a stream that sets none to 1,000 (and replaces 0 or
#: -1 with that default); Corral makes one on the work stream per node (each agent's) and one on the feed per
#: reader (each person's ``feed-<user>``, each service account's), so a cluster's size sets the need.
MAX_CONSUMERS = 100_000


async def declare(
    js: JetStreamContext,
    replicas: int = 1,
    nodes: Sequence[str] = (),
    feed_readers: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Create or update every stream and bucket Corral uses, the work consumer of each of ``nodes`` (the
    cluster config's; idempotent: a consumer's filter is set back to its node's if it was changed; needs the
    admin role), and the feed consumer of each of ``feed_readers`` (name -> its filters: the auditor's, a
    service account's)."""
    streams = [
        api.StreamConfig(
            name=subjects.EVENTS_STREAM,
            subjects=[subjects.EVENTS_SUBJECTS],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            duplicate_window=DUPLICATE_WINDOW_S,
            num_replicas=replicas,
            allow_direct=True,
            max_msg_size=8 * 1024 * 1024,
            max_consumers=MAX_CONSUMERS,
        ),
        api.StreamConfig(
            name=subjects.WORK_STREAM,
            subjects=[subjects.WORK_SUBJECTS],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=WORK_MAX_AGE_S,
            num_replicas=replicas,
            max_consumers=MAX_CONSUMERS,
        ),
        api.StreamConfig(
            # The job event feed (``services/feed``): kept for FEED_MAX_AGE_S, duplicates dropped (a
            # restarted or second feed replica publishes the same message ids again).
            name=subjects.FEED_STREAM,
            subjects=[subjects.FEED_SUBJECTS],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=FEED_MAX_AGE_S,
            num_replicas=replicas,
            allow_direct=True,
            max_consumers=MAX_CONSUMERS,
        ),
        api.StreamConfig(
            name=subjects.DLQ_STREAM,
            subjects=[subjects.DLQ_SUBJECTS],
            storage=api.StorageType.FILE,
            # A skipped log entry is dead-lettered once however often it is replayed (message ids).
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=30 * 24 * 3600.0,
            num_replicas=replicas,
            max_consumers=MAX_CONSUMERS,
        ),
    ]
    for config in streams:
        try:
            await js.add_stream(config)
        except APIError:
            await js.update_stream(config)
    await js.create_key_value(bucket=subjects.IDS_BUCKET, history=1, replicas=replicas)
    await js.create_key_value(bucket=subjects.LEADER_BUCKET, history=1, replicas=replicas)
    await js.create_key_value(bucket=subjects.REVOKED_BUCKET, history=1, replicas=replicas)
    await js.create_object_store(bucket=subjects.SNAPSHOT_BUCKET, replicas=replicas)
    for name, filters in (feed_readers or {}).items():
        await js.add_consumer(subjects.FEED_STREAM, feed_reader(name, filters))
    for node in nodes:
        # JetStream's consumer create is create-or-update: an existing consumer keeps its position.
        await js.add_consumer(subjects.WORK_STREAM, work_consumer(node))


async def connect(creds: Credentials, name: str, link: Link | None = None, **options: Any) -> Client:
    """Connect to NATS with a role's credentials; replies go to the role's own inbox prefix. The URL may
    name a cluster's servers, comma-separated: the client connects to one and fails over to the others.

    ``link`` (a new one when not given) gets the connection's error, disconnection, reconnection and
    close callbacks."""
    link = link or Link(name)
    nc = Client()
    # (nats-py's Client.connect annotates reconnect_time_wait as int; it takes seconds as a float)
    waits: dict[str, Any] = {"reconnect_time_wait": 0.5}
    try:
        await nc.connect(
            [url.strip() for url in creds.url.split(",") if url.strip()],
            user=creds.user,
            password=creds.password,
            name=name,
            inbox_prefix=subjects.inbox_prefix(creds.user),
            max_reconnect_attempts=-1,
            error_cb=link.error,
            disconnected_cb=link.disconnected,
            reconnected_cb=link.reconnected,
            closed_cb=link.closed,
            **waits,
            **options,
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await nc.close()  # a failed first connection leaves its socket open otherwise (nats-py)
        raise
    link.url = lambda: _shown(nc)
    return nc


def _shown(nc: Client) -> str | None:
    """The URL of the server ``nc`` is connected to, without credentials."""
    url = nc.connected_url
    return None if url is None else f"{url.scheme}://{url.hostname}:{url.port}"
