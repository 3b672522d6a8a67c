"""A small synchronous NATS request/reply client for the Slurm-style CLI commands.

Why it exists: sbatch, squeue, sacct… are spawned once per call, often in bulk by tools like submitit, and
importing nats-py and starting an asyncio loop costs more than the round trip itself. This module speaks the
NATS text protocol (INFO, CONNECT, PING/PONG, SUB, PUB/HPUB, MSG/HMSG, -ERR) over one blocking socket and does
one thing: publish a request with a reply inbox and wait for the answer. Services keep using nats-py.

A connection can also subscribe to subjects, publish without a reply, and hand out the messages of its
subscriptions one at a time (``next_message``): what ``srun`` needs to stream a step's output without
nats-py. Messages of those subscriptions that arrive while a request waits for its reply are kept, in order.

One exchange on the wire::

    S: INFO {...}                        C: CONNECT {...} / SUB <inbox>.* 1 / PING
    S: PONG            (or -ERR 'Authorization Violation' and close)
    C: HPUB <subject> <inbox>.<n> <hdr_len> <total_len> / <headers><payload> / PING
    S: HMSG <inbox>.<n> 1 <hdr_len> <total_len> / <headers><payload>    (and PONG, in either order)

``request`` (a connection for one request: every Slurm command's call) sends its HPUB in the write of CONNECT,
SUB and PING, a round trip less. The server takes a connection's operations in order: a refused login closes
it before the HPUB is read (the same NatsConnectError), and the first PONG, or a -ERR before it, answers the
login alone. INFO is still awaited first (no password to a server that wants TLS). A refused inbox
subscription (a permission the cluster grants every user) is then reported after the request was delivered.

The errors (``NatsRequestError`` and its subclasses, with their hierarchy) are in ``nats_errors.py`` and the
protocol's pieces (URL, socket, header blocks, op reader, the reply and message records) in ``nats_wire.py``;
this module is the client.

TLS is not supported yet: ``tls://`` URLs and servers that require TLS raise NatsConnectError.
"""

from __future__ import annotations

# _socket, not socket, as in nats_wire: socket.py costs a command ~5 ms of start-up.
import _socket
import collections
import os
import time
import types

# msgspec, not json, for the CONNECT line (see nats_wire).
import msgspec

from corral.libs.runtime.nats_errors import (
    NatsConnectError,
    NatsRequestError,
    NoResponders,
    PermissionDenied,
    RequestTimeout,
    ServerUnreachable,
)
from corral.libs.runtime.nats_wire import (
    Message,
    Reader,
    Reply,
    ServerAddress,
    check_subject,
    decode_headers,
    encode_headers,
    error_text,
    open_socket,
    parse_info,
)

__all__ = [
    "Connection",
    "Message",
    "NatsConnectError",
    "NatsRequestError",
    "NoResponders",
    "PermissionDenied",
    "Reply",
    "RequestTimeout",
    "ServerUnreachable",
    "request",
]

# The only subscription of a connection; every reply arrives on it.
_SID = b"1"


class Connection:
    """One connection for several requests, e.g. ``sacct -j A -j B``; use it as a context manager.

    Connecting sends CONNECT, subscribes the inbox ``<inbox_prefix>.<random>.*`` and waits for the PONG that
    answers a PING, so refused credentials surface here as NatsConnectError.
    """

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        inbox_prefix: str = "_INBOX",
        timeout: float = 10.0,
        confirm: bool = True,
    ) -> None:
        check_subject(inbox_prefix, "inbox prefix")
        # A cluster's servers, comma-separated: the first that takes the connection serves it.
        servers = [ServerAddress(part.strip()) for part in url.split(",") if part.strip()]
        servers = servers or [ServerAddress(url)]
        self._inbox = f"{inbox_prefix}.{os.urandom(8).hex()}"
        self._seq = 0
        self._max_payload = 1 << 20
        self._subjects: dict[bytes, str] = {}  # sid -> subject, of the subscriptions beyond the inbox
        self._messages: collections.deque[Message] = collections.deque()  # received, not handed out yet
        self._login = b""  # CONNECT, SUB and PING not sent yet: they go with the first request (``confirm``)
        self._user = user  # the login's user (for its errors)
        deadline = time.monotonic() + timeout
        for i, server in enumerate(servers):
            self._url = server.shown
            try:
                self._sock = open_socket(server.host, server.port, timeout)
            except OSError as exc:
                if i + 1 < len(servers):
                    continue  # that server is down: the next one
                if isinstance(exc, ConnectionError):  # refused, reset, aborted: not there (yet)
                    raise ServerUnreachable(self._url, str(exc) or type(exc).__name__) from exc
                raise NatsConnectError(self._url, str(exc) or type(exc).__name__) from exc
            break
        self._reader = Reader(self._sock)
        try:
            self._handshake(server, user, password, deadline, confirm)
        except BaseException:
            self._sock.close()
            raise

    def _handshake(
        self, server: ServerAddress, user: str | None, password: str | None, deadline: float, confirm: bool
    ) -> None:
        """Read INFO; log in now, or with ``confirm`` False with the first request (``_confirm``)."""
        try:
            self._sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            line, _ = self._reader.next_op(deadline)
            if not line.startswith(b"INFO "):
                raise NatsConnectError(self._url, f"not a NATS server (it sent {line[:40]!r})")
            info = parse_info(line)
            if info.get("tls_required"):
                raise NatsConnectError(self._url, "the server requires TLS, which the CLI client lacks")
            if not info.get("headers"):
                raise NatsConnectError(self._url, "the server does not support headers (nats-server < 2.2)")
            self._max_payload = int(info.get("max_payload", self._max_payload))
            options: dict[str, object] = {
                "verbose": False,
                "pedantic": False,
                "headers": True,
                "no_responders": True,
                "lang": "python-corral",
                "version": "0.1",
                "protocol": 1,
            }
            user = server.user if user is None else user
            password = server.password if password is None else password
            if user is not None:
                options["user"] = user
                options["pass"] = password or ""
            elif server.token is not None:
                options["auth_token"] = server.token
            connect = msgspec.json.encode(options).decode()
            self._user = user
            login = f"CONNECT {connect}\r\nSUB {self._inbox}.* {_SID.decode()}\r\nPING\r\n".encode()
        except (OSError, ValueError) as exc:  # TimeoutError among them
            raise NatsConnectError.of(self._url, exc) from exc
        self._login = login
        if confirm:
            self._confirm(b"", deadline)

    def _confirm(self, request: bytes, deadline: float) -> None:
        """Send the login with ``request`` after it, and wait for the PONG that answers the login."""
        login, self._login = self._login, b""
        try:
            self._send(login + request, deadline)
            while True:
                line, _ = self._reader.next_op(deadline)
                if line == b"PONG":
                    return
                if line.startswith(b"-ERR"):
                    error = self._server_error(line)
                    if isinstance(error, PermissionDenied):
                        raise error
                    as_user = f" (as user {self._user!r})" if self._user is not None else ""
                    raise NatsConnectError(self._url, error_text(line) + as_user)
                self._answer_control(line, deadline)
        except (OSError, ValueError) as exc:  # TimeoutError among them
            raise NatsConnectError.of(self._url, exc) from exc

    def request(
        self, subject: str, payload: bytes, *, headers: dict[str, str] | None = None, timeout: float = 10.0
    ) -> Reply:
        """Publish ``payload`` to ``subject`` and return the first reply.

        Raises NoResponders, RequestTimeout or PermissionDenied (the connection stays usable after these), or
        NatsRequestError when the connection is lost (it is then closed).
        """
        return self._exchange(subject, payload, headers, time.monotonic() + timeout, timeout)

    def _exchange(
        self, subject: str, payload: bytes, headers: dict[str, str] | None, deadline: float, timeout: float
    ) -> Reply:
        check_subject(subject, "subject")
        if self._sock.fileno() < 0:
            raise NatsRequestError(f"the connection to {self._url} is closed")
        self._seq += 1
        reply_to = f"{self._inbox}.{self._seq}"
        header_block = encode_headers(headers) if headers else b""
        size = len(header_block) + len(payload)
        if size > self._max_payload:
            raise NatsRequestError(
                f"request of {size} bytes exceeds the server's max_payload {self._max_payload}"
            )
        if header_block:
            op = f"HPUB {subject} {reply_to} {len(header_block)} {size}\r\n".encode() + header_block
        else:
            op = f"PUB {subject} {reply_to} {size}\r\n".encode()
        data = b"".join((op, payload, b"\r\nPING\r\n"))
        if self._login:
            self._confirm(data, deadline)  # the login and this request in one write (module docstring)
            data = b""
        try:
            # The PING makes the server confirm it processed the PUB: a -ERR about it arrives before the PONG.
            if data:
                self._send(data, deadline)
            return self._wait_reply(subject, reply_to.encode(), deadline)
        except TimeoutError as exc:
            raise RequestTimeout(subject, timeout) from exc
        except OSError as exc:
            self.close()
            raise NatsRequestError(f"lost the connection to {self._url}: {exc}") from exc
        except (NoResponders, PermissionDenied):
            raise
        except NatsRequestError:
            self.close()
            raise

    def _wait_reply(self, subject: str, reply_to: bytes, deadline: float) -> Reply:
        while True:
            line, body = self._reader.next_op(deadline)
            if body is None:
                if line.startswith(b"-ERR"):
                    raise self._server_error(line)
                self._answer_control(line, deadline)
                continue
            args = line.split()
            if args[2] != _SID:
                self._keep(args, body)
                continue
            # A reply to an earlier request that timed out is dropped: each request has its own reply subject.
            if args[1] != reply_to:
                continue
            if args[0].upper() == b"MSG":
                return Reply(body, {})
            header_len = int(args[-2])
            status, headers = decode_headers(body[:header_len])
            data = body[header_len:]
            if status == 503 and not data:
                raise NoResponders(subject)
            return Reply(data, headers, status)

    def subscribe(self, subject: str, timeout: float = 10.0) -> None:
        """Subscribe to ``subject`` (wildcards allowed); its messages come out of ``next_message``.

        Waits for the server to confirm (PING/PONG), so a refused subscription raises PermissionDenied here.
        """
        check_subject(subject, "subject")
        sid = str(len(self._subjects) + 2).encode()
        self._subjects[sid] = subject
        deadline = time.monotonic() + timeout
        try:
            self._send(b"SUB %s %s\r\nPING\r\n" % (subject.encode(), sid), deadline)
            while True:
                line, body = self._reader.next_op(deadline)
                if body is not None:
                    self._keep(line.split(), body)
                elif line.startswith(b"-ERR"):
                    raise self._server_error(line)
                elif line == b"PONG":
                    return
                else:
                    self._answer_control(line, deadline)
        except TimeoutError as exc:
            raise RequestTimeout(f"SUB {subject}", timeout) from exc
        except OSError as exc:
            self.close()
            raise NatsRequestError(f"lost the connection to {self._url}: {exc}") from exc

    def publish(self, subject: str, payload: bytes, timeout: float = 10.0) -> None:
        """Publish ``payload`` to ``subject`` without waiting (a -ERR about it surfaces later)."""
        check_subject(subject, "subject")
        if len(payload) > self._max_payload:
            raise NatsRequestError(f"message of {len(payload)} bytes exceeds max_payload {self._max_payload}")
        try:
            self._send(
                b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload), time.monotonic() + timeout
            )
        except TimeoutError as exc:
            raise RequestTimeout(subject, timeout) from exc
        except OSError as exc:
            self.close()
            raise NatsRequestError(f"lost the connection to {self._url}: {exc}") from exc

    def next_message(self, timeout: float) -> Message | None:
        """The next message of a subscription, waiting at most ``timeout`` seconds (0: only what has
        arrived); None when none came. A -ERR from the server raises (PermissionDenied for a publish
        that was refused); a lost connection raises NatsRequestError."""
        deadline = time.monotonic() + timeout
        try:
            while not self._messages:
                line, body = self._reader.next_op(deadline)
                if body is not None:
                    self._keep(line.split(), body)
                elif line.startswith(b"-ERR"):
                    raise self._server_error(line)
                else:
                    self._answer_control(line, deadline)
        except TimeoutError:
            return None
        except OSError as exc:
            self.close()
            raise NatsRequestError(f"lost the connection to {self._url}: {exc}") from exc
        return self._messages.popleft()

    def fileno(self) -> int:
        """The socket's descriptor, to wait on it with ``select`` beside other files; call
        ``next_message(0)`` until it returns None before waiting (messages may be buffered already)."""
        return self._sock.fileno()

    def local_address(self) -> tuple[str, int]:
        """This end of the connection: (IP address, port), as the server sees it connect."""
        address = self._sock.getsockname()
        return str(address[0]), int(address[1])

    def _keep(self, args: list[bytes], body: bytes) -> None:
        """Queue a message of a subscription (not the inbox); other sids are dropped."""
        if args[2] not in self._subjects:
            return
        data = body if args[0].upper() == b"MSG" else body[int(args[-2]) :]
        self._messages.append(Message(args[1].decode("utf-8", "replace"), data))

    def _answer_control(self, line: bytes, deadline: float) -> None:
        """Handle PING, PONG, +OK and INFO; anything else is a protocol error."""
        op = line.split(maxsplit=1)[0].upper() if line else b""
        if op == b"PING":
            self._send(b"PONG\r\n", deadline)
        elif op == b"INFO":
            self._max_payload = int(parse_info(line).get("max_payload", self._max_payload))
        elif op not in (b"PONG", b"+OK"):
            raise NatsRequestError(f"unexpected line from the NATS server at {self._url}: {line[:80]!r}")

    def _server_error(self, line: bytes) -> NatsRequestError:
        text = error_text(line)
        if text.startswith("Permissions Violation"):
            return PermissionDenied(text)
        return NatsRequestError(f"the NATS server at {self._url} says: {text}")

    def _send(self, data: bytes, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self._sock.settimeout(remaining)
        self._sock.sendall(data)

    def close(self) -> None:
        """Close the socket; the server drops the inbox subscription with it."""
        self._sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.close()


def request(
    url: str,
    subject: str,
    payload: bytes,
    *,
    user: str | None = None,
    password: str | None = None,
    inbox_prefix: str = "_INBOX",
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Reply:
    """Connect to ``url``, send one request and return its reply; ``timeout`` bounds the whole exchange.

    ``url`` is ``nats://host:port``, ``nats://user:pass@host:port`` or ``host:port``; ``user`` and
    ``password`` override the URL's. ``inbox_prefix`` must be a subject the user may subscribe to.
    """
    deadline = time.monotonic() + timeout
    with Connection(
        url, user=user, password=password, inbox_prefix=inbox_prefix, timeout=timeout, confirm=False
    ) as conn:
        return conn._exchange(subject, payload, headers, deadline, timeout)
