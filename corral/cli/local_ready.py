"""When a local cluster that was just started is ready: a command run then finds every service it may call."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec

from corral.libs.runtime.credentials import read_credentials

if TYPE_CHECKING:
    from corral.cli.local_cluster import LocalCluster


def wait_ready(cluster: LocalCluster, timeout: float) -> None:
    """Wait until every configured node is registered and idle or busy in sinfo's view, and the gateway
    and accounting answer too (the scheduler answers ``nodes``): a command run right after this returns
    finds every service it may call."""
    from corral.libs.runtime.nats_request import NatsRequestError, request
    from corral.schemas import api, subjects
    from corral.schemas.codec import decode, encode

    creds = read_credentials(cluster.user_credentials)

    def call(verb: str, body: msgspec.Struct) -> bytes:
        return request(
            creds.url,
            subjects.api_subject(verb, creds.user),
            encode(body),
            user=creds.user,
            password=creds.password,
            inbox_prefix=subjects.inbox_prefix(creds.user),
            timeout=2.0,
        ).data

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cluster.check_alive()
        if not cluster.auth.socket.exists():
            time.sleep(0.1)
            continue
        try:
            nodes = decode(call("nodes", api.NodesRequest()), api.NodesReply | api.ApiError)
            # (a local cluster's few nodes are one page)
            if (
                isinstance(nodes, api.NodesReply)
                and not nodes.more
                and all(n.state not in ("unknown", "down") for n in nodes.nodes)
            ):
                # any answer will do (a job that does not exist): what matters is that one comes
                call("cancel", api.CancelRequest(job_ids=[]))
                call("acct", api.AcctRequest(job_ids=[0], limit=1))
                return
        except NatsRequestError:
            pass
        time.sleep(0.2)
    raise TimeoutError(
        f"the local cluster did not become ready in {timeout:.0f}s; see {cluster.state_dir}/logs"
    )
