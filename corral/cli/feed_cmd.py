"""``corral feed``: the user's job event feed as JSON lines (``docs/integrations.md``, "Following the feed").

    corral feed                  # the feed's history of your jobs, then follow it
    corral feed --idle-exit 5    # stop once nothing came for 5 s

It reads the consumer the feed service made for the user (``feed-<user>``, filtered on their jobs) and
acknowledges each message it printed, so a second run goes on where the first stopped, as any follower of
that consumer does (the Node.js example included).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import msgspec
import nats
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError

from corral.cli.client import find_cluster
from corral.cli.errors import CliError, run_command
from corral.libs.runtime.credentials import Credentials
from corral.schemas import subjects

COMMAND = "corral feed"
#: Seconds one fetch waits for messages.
FETCH_S = 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Print your job event feed as JSON lines.")
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop once no message came for this long (default: follow for ever)",
    )
    return parser


async def _follow(creds: Credentials, idle_exit: float | None) -> None:
    # Not ``streams.connect``: its connection log lines would go to stdout, among the JSON lines.
    nc = await nats.connect(
        [url.strip() for url in creds.url.split(",") if url.strip()],
        user=creds.user,
        password=creds.password,
        name="corral-feed",
        inbox_prefix=subjects.inbox_prefix(creds.user),
    )
    durable = subjects.feed_consumer(creds.user)
    try:
        idle_since = time.monotonic()
        sub = None
        while sub is None:
            try:
                sub = await nc.jetstream().pull_subscribe_bind(durable=durable, stream=subjects.FEED_STREAM)
                await sub.consumer_info()
            except NotFoundError:
                # The feed service makes it with the user's first job.
                sub = None
                if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                    return
                await asyncio.sleep(FETCH_S)
        await _print(sub, idle_exit, idle_since)
    finally:
        await nc.close()


async def _print(sub: JetStreamContext.PullSubscription, idle_exit: float | None, idle_since: float) -> None:
    """Print and acknowledge what ``sub`` fetches until nothing came for ``idle_exit`` seconds (or ever)."""
    while True:
        try:
            msgs = await sub.fetch(256, timeout=FETCH_S)
        except TimeoutError:
            # nats.errors.TimeoutError is one, and nats-py also raises a plain asyncio.TimeoutError when the
            # fetch's time ran out before its waiting pull request was sent (a busy server or client).
            if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                return
            continue
        for msg in msgs:
            line = msgspec.json.encode({"subject": msg.subject, **msgspec.json.decode(msg.data)})
            sys.stdout.buffer.write(line + b"\n")
            await msg.ack()
        sys.stdout.flush()
        idle_since = time.monotonic()


def _feed(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.idle_exit is not None and args.idle_exit <= 0:
        raise CliError("--idle-exit must be a positive number of seconds")
    cluster = find_cluster()
    creds = Credentials(url=cluster.url, user=cluster.credentials.user, password=cluster.credentials.password)
    try:
        asyncio.run(_follow(creds, args.idle_exit))
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``corral feed``."""
    return run_command(COMMAND, _feed, argv)
