"""A request's reply subject cannot make a service write where the requester may not (a real nats-server).

The requester chooses the reply subject and the service publishes its answer there with its own rights. With
``allow_responses`` on every role and answers on any reply subject, one request of an ordinary user with
``reply=$KV.corral_ids.job_id`` overwrote the job-id counter (every later sbatch failed), one with
``reply=corral.evt.job.<J>.job_allocated`` put an undecodable entry on another user's job, one with
``reply=corral.evt.node.node2.node_down`` an entry on node2's subjects, and one with ``reply=corral.hb.node2``
a heartbeat of node2 that health believed. Now ``serve`` answers only on the caller's own inbox and
dead-letters the rest, and no role but the admin may publish on a reply subject its permissions do not name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.js.errors import NotFoundError

from corral.libs.config.cluster import parse_config
from corral.libs.infra import NatsServer, roles
from corral.libs.runtime.api_server import serve
from corral.libs.runtime.bus import Bus, NatsApi
from corral.libs.runtime.clock import SystemClock
from corral.libs.runtime.credentials import Credentials
from corral.libs.runtime.streams import connect, declare
from corral.schemas import api, subjects
from corral.schemas.codec import decode, encode
from corral.services.gateway.app import Gateway
from corral.services.scheduler.app import Scheduler

pytestmark = pytest.mark.integration

AGENT = roles.agent_role("node1")
PASSWORDS = {
    roles.ADMIN: "admin-secret",
    roles.GATEWAY: "gateway-secret",
    roles.SCHEDULER: "scheduler-secret",
    roles.ACCOUNTING: "accounting-secret",
    roles.HEALTH: "health-secret",
    AGENT: "agent-secret",
    "alice": "alice-secret",
}
CONFIG = parse_config("""
[[nodes]]
names = "node[1-2]"
cpus = 8
memory = "16G"
gpus = 4
""")
#: Where a reply must never land, each named by what writing there did.
TARGETS = {
    "job id counter": f"$KV.{subjects.IDS_BUCKET}.{subjects.JOB_ID_KEY}",
    "another user's job": subjects.job_subject(7, "job_allocated"),
    "a node's fact": subjects.node_subject("node2", "node_down"),
    "a node's heartbeat": subjects.heartbeat_subject("node2"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    users = [
        roles.agent_user("node1", password)
        if role == AGENT
        else roles.user_user(role, password)
        if role == "alice"
        else roles.service_user(role, password)
        for role, password in PASSWORDS.items()
    ]
    with NatsServer(Path(tmp_path_factory.mktemp("nats")), users) as nats_server:
        yield nats_server


@pytest.fixture
async def conns(server: NatsServer) -> AsyncIterator[dict[str, Client]]:
    """A connection of each role, and fresh streams (declared by the admin)."""
    opened: dict[str, Client] = {}
    for role, password in PASSWORDS.items():
        creds = Credentials(url=server.url, user=role, password=password)
        opened[role] = await connect(creds, name=f"test-{role}")
    admin = opened[roles.ADMIN].jetstream()
    for stream in (subjects.EVENTS_STREAM, subjects.DLQ_STREAM, f"KV_{subjects.IDS_BUCKET}"):
        with contextlib.suppress(NotFoundError):
            await admin.delete_stream(stream)
    await declare(admin)
    try:
        yield opened
    finally:
        for nc in opened.values():
            await nc.close()


class Spy:
    """What an admin connection hears on one subject (a publish anywhere is heard: $KV and the log too)."""

    def __init__(self) -> None:
        self.heard: list[Msg] = []

    async def watch(self, nc: Client, subject: str) -> None:
        await nc.subscribe(subject, cb=self._heard)
        await nc.flush()

    async def _heard(self, msg: Msg) -> None:
        self.heard.append(msg)


async def serve_gateway(conns: dict[str, Client]) -> Bus:
    """The real gateway's verbs, served as the gateway role; its bus."""
    nc = conns[roles.GATEWAY]
    bus = Bus(nc, roles.GATEWAY)
    gateway = Gateway(bus, bus, NatsApi(nc, roles.GATEWAY), CONFIG, SystemClock())
    for verb, (kind, handler) in gateway.handlers().items():
        await serve(nc, verb, kind, handler, queue="gateway")
    return bus


async def attack(alice: Client, verb: str, data: bytes, reply: str) -> None:
    """Send one request as alice with ``reply`` as its reply subject, then one on her own inbox, whose answer
    comes after the attack's would have (one subscription's requests are handled in order)."""
    await alice.publish(subjects.api_subject(verb, "alice"), data, reply=reply)
    answer = await alice.request(subjects.api_subject(verb, "alice"), data, timeout=10)
    assert answer.data


async def dead_letter(conns: dict[str, Client], service: str) -> Msg:
    js = conns[roles.ADMIN].jetstream()
    return await js.get_last_msg(subjects.DLQ_STREAM, subjects.dlq_subject(service))


@pytest.mark.parametrize("target", list(TARGETS.values()), ids=list(TARGETS))
async def test_the_gateway_answers_only_on_the_callers_inbox(conns: dict[str, Client], target: str) -> None:
    bus = await serve_gateway(conns)
    first = await bus.next_job_id()
    spy, health_spy = Spy(), Spy()
    await spy.watch(conns[roles.ADMIN], target)
    # Health's own subscription: a heartbeat it would believe.
    await health_spy.watch(conns[roles.HEALTH], subjects.heartbeat_subject("*"))
    await attack(conns["alice"], "submit", b"{}", target)
    await conns[roles.ADMIN].flush()
    await conns[roles.HEALTH].flush()
    assert spy.heard == []
    assert health_spy.heard == []
    assert await bus.next_job_id() == first + 1  # the counter is intact: sbatch still gets ids
    assert await bus.last_seq() == 0  # nothing on any job's or node's subjects
    letter = await dead_letter(conns, "gateway")
    assert letter.headers is not None
    assert target in letter.headers["Corral-Reason"]
    assert letter.headers["Corral-Subject"] == subjects.api_subject("submit", "alice")


async def test_the_scheduler_answers_only_on_the_callers_inbox(conns: dict[str, Client]) -> None:
    nc = conns[roles.SCHEDULER]
    scheduler = Scheduler(Bus(nc, roles.SCHEDULER), CONFIG)
    await serve(nc, "ping", api.PingRequest, scheduler.ping, queue="")
    target = TARGETS["another user's job"]
    spy = Spy()
    await spy.watch(conns[roles.ADMIN], target)
    await attack(conns["alice"], "ping", encode(api.PingRequest()), target)
    await conns[roles.ADMIN].flush()
    assert spy.heard == []
    letter = await dead_letter(conns, "scheduler")
    assert letter.headers is not None and target in letter.headers["Corral-Reason"]


async def test_a_request_on_the_callers_inbox_is_answered(conns: dict[str, Client]) -> None:
    await serve_gateway(conns)
    answer = await conns["alice"].request(subjects.api_subject("submit", "alice"), b"{}", timeout=10)
    assert decode(answer.data, api.ApiError).code == "invalid"  # answered: `{}` is no submission
    with pytest.raises(NotFoundError):
        await dead_letter(conns, "gateway")


#: A role that answers requests, the request subject it hears alice on.
ANSWERERS = {
    roles.GATEWAY: subjects.api_subject("submit", "alice"),
    roles.SCHEDULER: subjects.api_subject("ping", "alice"),
    roles.ACCOUNTING: subjects.api_subject("acct", "alice"),
    AGENT: "corral.step.node1.alice",
}
#: (role, target) where the role has no right of its own to publish: the gateway writes the counter and the
#: scheduler decisions, so there only ``serve``'s inbox rule stands between a reply and the subject.
BEYOND_RIGHTS = [
    (role, name)
    for role in ANSWERERS
    for name in TARGETS
    if (role, name) not in {(roles.GATEWAY, "job id counter"), (roles.SCHEDULER, "another user's job")}
]


@pytest.mark.parametrize(("role", "target"), BEYOND_RIGHTS, ids=[f"{r}-{t}" for r, t in BEYOND_RIGHTS])
async def test_no_role_may_publish_on_a_reply_subject_beyond_its_rights(
    conns: dict[str, Client], role: str, target: str
) -> None:
    """The second wall: a service that answered blindly (a bug) still could not write there."""
    nc = conns[role]
    answered = asyncio.Event()

    async def blind(msg: Msg) -> None:
        await nc.publish(msg.reply, b"not an event")
        answered.set()

    await nc.subscribe(ANSWERERS[role], cb=blind)
    await nc.flush()
    spy = Spy()
    await spy.watch(conns[roles.ADMIN], TARGETS[target])
    await conns["alice"].publish(ANSWERERS[role], b"{}", reply=TARGETS[target])
    await asyncio.wait_for(answered.wait(), 10)
    await nc.flush()
    await conns[roles.ADMIN].flush()
    assert spy.heard == []
    assert await Bus(conns[roles.ADMIN], "test").last_seq() == 0


async def test_a_role_still_answers_on_a_callers_inbox(conns: dict[str, Client]) -> None:
    nc = conns[roles.GATEWAY]

    async def echo(msg: Msg) -> None:
        await msg.respond(b"pong")

    await nc.subscribe(ANSWERERS[roles.GATEWAY], cb=echo)
    await nc.flush()
    # Once seen in CI under load: no responders just after the flush. What is tested is the right to answer,
    # not how soon the server has the subscription: ask again for a few seconds.
    for _ in range(20):
        try:
            answer = await conns["alice"].request(ANSWERERS[roles.GATEWAY], b"{}", timeout=10)
            break
        except NoRespondersError:
            await asyncio.sleep(0.2)
    assert answer.data == b"pong"
