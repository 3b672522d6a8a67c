"""Where Corral's JetStream state is declared, in one place, and how a role connects.

- ``declare`` creates or updates the three streams (the log, the work queues, the dead letters), the
  job-id bucket, the schedulers' leader bucket and the snapshot store (idempotent; the admin role runs it);
- ``connect`` opens a role's connection, replies to its own inbox prefix, reconnecting for ever (nats-py
  sends its subscriptions again on each reconnection); its events are logged one line each by a
  ``nats_link.Link``, which also tells the loops that watch it.
"""

from __future__ import annotations

from typing import Any

import nats
from nats.aio.client import Client
from nats.js import JetStreamContext, api
from nats.js.errors import APIError

from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.nats_link import Link
from corral.schemas import subjects

#: How long a retry with the same Nats-Msg-Id is recognised as a duplicate.
DUPLICATE_WINDOW_S = 24 * 3600.0


async def declare(js: JetStreamContext, replicas: int = 1) -> None:
    """Create or update every stream and bucket Corral uses (idempotent; needs the admin role)."""
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
        ),
        api.StreamConfig(
            name=subjects.WORK_STREAM,
            subjects=[subjects.WORK_SUBJECTS],
            storage=api.StorageType.FILE,
            retention=api.RetentionPolicy.LIMITS,
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=7 * 24 * 3600.0,
            num_replicas=replicas,
        ),
        api.StreamConfig(
            name=subjects.DLQ_STREAM,
            subjects=[subjects.DLQ_SUBJECTS],
            storage=api.StorageType.FILE,
            # A skipped log entry is dead-lettered once however often it is replayed (message ids).
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=30 * 24 * 3600.0,
            num_replicas=replicas,
        ),
    ]
    for config in streams:
        try:
            await js.add_stream(config)
        except APIError:
            await js.update_stream(config)
    await js.create_key_value(bucket=subjects.IDS_BUCKET, history=1, replicas=replicas)
    await js.create_key_value(bucket=subjects.LEADER_BUCKET, history=1, replicas=replicas)
    await js.create_object_store(bucket=subjects.SNAPSHOT_BUCKET, replicas=replicas)


async def connect(creds: Credentials, name: str, link: Link | None = None, **options: Any) -> Client:
    """Connect to NATS with a role's credentials; replies go to the role's own inbox prefix. The URL may
    name a cluster's servers, comma-separated: the client connects to one and fails over to the others.

    ``link`` (a new one when not given) gets the connection's error, disconnection, reconnection and
    close callbacks."""
    link = link or Link(name)
    nc = await nats.connect(
        [url.strip() for url in creds.url.split(",") if url.strip()],
        user=creds.user,
        password=creds.password,
        name=name,
        inbox_prefix=subjects.inbox_prefix(creds.user),
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=link.error,
        disconnected_cb=link.disconnected,
        reconnected_cb=link.reconnected,
        closed_cb=link.closed,
        **options,
    )
    link.url = lambda: _shown(nc)
    return nc


def _shown(nc: Client) -> str | None:
    """The URL of the server ``nc`` is connected to, without credentials."""
    url = nc.connected_url
    return None if url is None else f"{url.scheme}://{url.hostname}:{url.port}"
