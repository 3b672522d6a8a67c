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

Error hierarchy::

    NatsRequestError        root; also: connection lost, protocol error, payload too big, any other -ERR
    ├── NatsConnectError    bad URL, TLS asked for, server unreachable or silent, authentication refused
    ├── NoResponders        the server's 503 status: nobody subscribes to the subject
    ├── RequestTimeout      no reply before the deadline
    └── PermissionDenied    -ERR 'Permissions Violation …': may not publish the subject or subscribe the inbox

TLS is not supported yet: ``tls://`` URLs and servers that require TLS raise NatsConnectError.
"""

from __future__ import annotations

# _socket is the C module under socket: socket.py turns its constants into enums when it loads, ~5 ms of a
# command's start-up here, for nothing this client uses. ``_connect`` is socket.create_connection over it.
import _socket
import collections
import os
import select
import time
import types
from typing import Any

# msgspec, not json, for the INFO and CONNECT lines: every command has msgspec loaded already, and json costs
# it ~2 ms more to load.
import msgspec

__all__ = [
    "Connection",
    "Message",
    "NatsConnectError",
    "NatsRequestError",
    "NoResponders",
    "PermissionDenied",
    "Reply",
    "RequestTimeout",
    "request",
]

DEFAULT_PORT = 4222
_CRLF = b"\r\n"
_RECV_SIZE = 1 << 16
# The only subscription of a connection; every reply arrives on it.
_SID = b"1"


class NatsRequestError(Exception):
    """Root of this module's errors; raised as is for a lost connection or an unexpected server answer."""


class NatsConnectError(NatsRequestError):
    """The connection could not be set up: bad URL, unreachable or silent server, or refused credentials."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot connect to NATS at {url}: {reason}")
        # The server URL, without its password.
        self.url = url
        # What went wrong: the OS error or the server's -ERR text, e.g. "Authorization Violation".
        self.reason = reason


class NoResponders(NatsRequestError):
    """The server answered with status 503: no service subscribes to the subject."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no Corral service is answering on {subject}: is the cluster running? (corral up)")
        # The subject nobody listens on.
        self.subject = subject


class RequestTimeout(NatsRequestError):
    """No reply arrived before the deadline."""

    def __init__(self, subject: str, timeout: float) -> None:
        super().__init__(f"no reply on {subject} within {timeout:g} s")
        # The subject the request went to.
        self.subject = subject
        # The time waited, in seconds.
        self.timeout = timeout


class PermissionDenied(NatsRequestError):
    """The server refused a publish or a subscription for this user (-ERR 'Permissions Violation …')."""

    def __init__(self, server_error: str) -> None:
        super().__init__(f"NATS refused: {server_error}")
        # The server's text, e.g. 'Permissions Violation for Publish to "svc.submit.bob"'.
        self.server_error = server_error


class Reply:
    """One reply message."""

    __slots__ = ("data", "headers", "status")

    def __init__(self, data: bytes, headers: dict[str, str], status: int | None = None) -> None:
        # The payload.
        self.data = data
        # The reply's headers; for a key sent more than once, the first value.
        self.headers = headers
        # The status code of the header line ("NATS/1.0 404"), None when it has none.
        self.status = status

    def __repr__(self) -> str:
        return f"Reply(data=<{len(self.data)} bytes>, headers={self.headers!r}, status={self.status!r})"


class Message:
    """One message of a subscription (``Connection.subscribe``)."""

    __slots__ = ("data", "subject")

    def __init__(self, subject: str, data: bytes) -> None:
        # The subject it was published to.
        self.subject = subject
        # The payload (headers, if any, dropped).
        self.data = data

    def __repr__(self) -> str:
        return f"Message(subject={self.subject!r}, data=<{len(self.data)} bytes>)"


class _Server:
    """Where to connect and as whom, parsed from a URL."""

    __slots__ = ("host", "password", "port", "shown", "token", "user")

    def __init__(self, url: str) -> None:
        scheme, sep, rest = url.partition("://")
        if not sep:
            scheme, rest = "nats", url
        scheme = scheme.lower()
        userinfo, at, hostport = rest.rstrip("/").rpartition("@")
        if ":" not in hostport or hostport.endswith("]"):  # no port, or a bracketed IPv6 address alone
            host, port = hostport, str(DEFAULT_PORT)
        else:
            host, _, port = hostport.rpartition(":")
        # The URL without credentials, for messages.
        self.shown = f"{scheme}://{hostport}"
        if scheme in ("tls", "ws", "wss"):
            raise NatsConnectError(self.shown, f"{scheme}:// is not supported by the CLI client, use nats://")
        if scheme != "nats" or not host or not port.isdigit():
            raise NatsConnectError(self.shown, "not a nats://host:port URL")
        self.host = host.removeprefix("[").removesuffix("]")
        self.port = int(port)
        user, has_password, password = userinfo.partition(":")
        # nats://user:pass@host is a user and password; nats://secret@host is a token.
        self.user = _unquote(user) if at and has_password else None
        self.password = _unquote(password) if at and has_password else None
        self.token = _unquote(user) if at and not has_password else None


def _unquote(text: str) -> str:
    """Percent-decode a URL part; urllib is imported only when there is something to decode."""
    if "%" not in text:
        return text
    from urllib.parse import unquote

    return unquote(text)


def _connect(host: str, port: int, timeout: float) -> _socket.socket:
    """A TCP connection to the first of the host's addresses that accepts one, as socket.create_connection.

    An ASCII host goes to getaddrinfo as bytes, which spares loading the idna codec (with stringprep and
    unicodedata, ~1 ms) that a str host costs.
    """
    name: str | bytes = host.encode() if host.isascii() else host
    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error or OSError(f"{host} has no address")


def _check_subject(subject: str, what: str) -> None:
    """Refuse a subject that would break the protocol line it is written into."""
    if not subject or any(c in subject for c in " \t\r\n"):
        raise ValueError(f"invalid NATS {what}: {subject!r}")


def _encode_headers(headers: dict[str, str]) -> bytes:
    """Encode headers as the NATS/1.0 block of an HPUB."""
    lines = ["NATS/1.0"]
    for key, value in headers.items():
        if not key or any(c in key for c in ": \t\r\n") or "\r" in value or "\n" in value:
            raise ValueError(f"invalid NATS header {key!r}: {value!r}")
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _decode_headers(block: bytes) -> tuple[int | None, dict[str, str]]:
    """Decode the NATS/1.0 block of an HMSG into its status code and headers."""
    first, *lines = block.decode("utf-8", "replace").split("\r\n")
    if not first.startswith("NATS/1.0"):
        raise NatsRequestError(f"malformed NATS header block: {first[:80]!r}")
    code = first[len("NATS/1.0") :].split(maxsplit=1)
    status = int(code[0]) if code and code[0].isdigit() else None
    headers: dict[str, str] = {}
    for line in lines:
        key, colon, value = line.partition(":")
        if colon:
            headers.setdefault(key.strip(), value.strip())
    return status, headers


def _info(line: bytes) -> dict[str, Any]:
    """The JSON object of an INFO line; ValueError when it is not one."""
    try:
        info = msgspec.json.decode(line[5:])
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed NATS INFO: {exc}") from None
    if not isinstance(info, dict):
        raise ValueError(f"malformed NATS INFO: {line[:80]!r}")
    return info


def _error_text(line: bytes) -> str:
    """The text of a -ERR line, without its quotes."""
    return line[len(b"-ERR") :].strip().strip(b"'").decode("utf-8", "replace")


def _body_size(line: bytes) -> int | None:
    """The number of bytes after a MSG/HMSG line (headers and payload), None for any other op."""
    op = line[:5].upper()
    if not (op.startswith(b"MSG ") or op.startswith(b"HMSG ")):
        return None
    args = line.split()
    expected = (4, 5) if op.startswith(b"MSG ") else (5, 6)
    if len(args) not in expected or not args[-1].isdigit():
        raise NatsRequestError(f"malformed NATS message line: {line[:120]!r}")
    return int(args[-1])


class _Reader:
    """Buffers socket reads and hands out whole server ops."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def next_op(self, deadline: float) -> tuple[bytes, bytes | None]:
        """Return the next op line and, for MSG/HMSG, its body.

        Nothing is consumed until the whole op is buffered, so a timeout in the middle of a large message
        leaves the reader consistent and the connection usable.
        """
        while True:
            end = self._buf.find(_CRLF)
            if end >= 0:
                line = bytes(self._buf[:end])
                size = _body_size(line)
                if size is None:
                    del self._buf[: end + 2]
                    return line, None
                start, stop = end + 2, end + 2 + size
                if len(self._buf) >= stop + 2:
                    if self._buf[stop : stop + 2] != _CRLF:
                        raise NatsRequestError("NATS message body is not followed by CRLF")
                    body = bytes(self._buf[start:stop])
                    del self._buf[: stop + 2]
                    return line, body
            self._fill(deadline)

    def _fill(self, deadline: float) -> None:
        remaining = max(0.0, deadline - time.monotonic())
        # select, not a socket timeout: the socket's timeout stays the one for sending, and a deadline
        # already past polls once (``Connection.next_message(0)``).
        readable, _, _ = select.select([self._sock], [], [], remaining)
        if not readable:
            raise TimeoutError
        chunk = self._sock.recv(_RECV_SIZE)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._buf += chunk


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
    ) -> None:
        _check_subject(inbox_prefix, "inbox prefix")
        server = _Server(url)
        self._url = server.shown
        self._inbox = f"{inbox_prefix}.{os.urandom(8).hex()}"
        self._seq = 0
        self._max_payload = 1 << 20
        self._subjects: dict[bytes, str] = {}  # sid -> subject, of the subscriptions beyond the inbox
        self._messages: collections.deque[Message] = collections.deque()  # received, not handed out yet
        deadline = time.monotonic() + timeout
        try:
            self._sock = _connect(server.host, server.port, timeout)
        except OSError as exc:
            raise NatsConnectError(self._url, str(exc) or type(exc).__name__) from exc
        self._reader = _Reader(self._sock)
        try:
            self._handshake(server, user, password, deadline)
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, server: _Server, user: str | None, password: str | None, deadline: float) -> None:
        try:
            self._sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            line, _ = self._reader.next_op(deadline)
            if not line.startswith(b"INFO "):
                raise NatsConnectError(self._url, f"not a NATS server (it sent {line[:40]!r})")
            info = _info(line)
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
            self._send(
                f"CONNECT {connect}\r\nSUB {self._inbox}.* {_SID.decode()}\r\nPING\r\n".encode(), deadline
            )
            while True:
                line, _ = self._reader.next_op(deadline)
                if line == b"PONG":
                    return
                if line.startswith(b"-ERR"):
                    error = self._server_error(line)
                    if isinstance(error, PermissionDenied):
                        raise error
                    as_user = f" (as user {user!r})" if user is not None else ""
                    raise NatsConnectError(self._url, _error_text(line) + as_user)
                self._answer_control(line, deadline)
        except TimeoutError as exc:
            raise NatsConnectError(self._url, "the server did not answer in time") from exc
        except (OSError, ValueError) as exc:
            raise NatsConnectError(self._url, str(exc) or type(exc).__name__) from exc

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
        _check_subject(subject, "subject")
        if self._sock.fileno() < 0:
            raise NatsRequestError(f"the connection to {self._url} is closed")
        self._seq += 1
        reply_to = f"{self._inbox}.{self._seq}"
        header_block = _encode_headers(headers) if headers else b""
        size = len(header_block) + len(payload)
        if size > self._max_payload:
            raise NatsRequestError(
                f"request of {size} bytes exceeds the server's max_payload {self._max_payload}"
            )
        if header_block:
            op = f"HPUB {subject} {reply_to} {len(header_block)} {size}\r\n".encode() + header_block
        else:
            op = f"PUB {subject} {reply_to} {size}\r\n".encode()
        try:
            # The PING makes the server confirm it processed the PUB: a -ERR about it arrives before the PONG.
            self._send(b"".join((op, payload, b"\r\nPING\r\n")), deadline)
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
            status, headers = _decode_headers(body[:header_len])
            data = body[header_len:]
            if status == 503 and not data:
                raise NoResponders(subject)
            return Reply(data, headers, status)

    def subscribe(self, subject: str, timeout: float = 10.0) -> None:
        """Subscribe to ``subject`` (wildcards allowed); its messages come out of ``next_message``.

        Waits for the server to confirm (PING/PONG), so a refused subscription raises PermissionDenied here.
        """
        _check_subject(subject, "subject")
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
        _check_subject(subject, "subject")
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
            self._max_payload = int(_info(line).get("max_payload", self._max_payload))
        elif op not in (b"PONG", b"+OK"):
            raise NatsRequestError(f"unexpected line from the NATS server at {self._url}: {line[:80]!r}")

    def _server_error(self, line: bytes) -> NatsRequestError:
        text = _error_text(line)
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
    with Connection(url, user=user, password=password, inbox_prefix=inbox_prefix, timeout=timeout) as conn:
        return conn._exchange(subject, payload, headers, deadline, timeout)
