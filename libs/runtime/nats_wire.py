"""The NATS text protocol as the synchronous client (``nats_request``) speaks it: the server's URL, the TCP
connection, subjects and header blocks, and a reader that hands out whole server ops (INFO, PING, MSG, HMSG,
-ERR ...) from one blocking socket, and the records it hands out (``Reply``, ``Message``).
"""

from __future__ import annotations

# _socket is the C module under socket: socket.py turns its constants into enums when it loads, ~5 ms of a
# command's start-up here, for nothing this client uses. ``open_socket`` is socket.create_connection over it.
import _socket
import select
import time
from typing import Any

# msgspec, not json, for the INFO and CONNECT lines: every command has msgspec loaded already, and json costs
# it ~2 ms more to load.
import msgspec

from corral.libs.runtime.nats_errors import NatsConnectError, NatsRequestError

DEFAULT_PORT = 4222
CRLF = b"\r\n"
RECV_SIZE = 1 << 16


class ServerAddress:
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
        self.user = unquote(user) if at and has_password else None
        self.password = unquote(password) if at and has_password else None
        self.token = unquote(user) if at and not has_password else None


def unquote(text: str) -> str:
    """Percent-decode a URL part; urllib is imported only when there is something to decode."""
    if "%" not in text:
        return text
    from urllib.parse import unquote

    return unquote(text)


def open_socket(host: str, port: int, timeout: float) -> _socket.socket:
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


def check_subject(subject: str, what: str) -> None:
    """Refuse a subject that would break the protocol line it is written into."""
    if not subject or any(c in subject for c in " \t\r\n"):
        raise ValueError(f"invalid NATS {what}: {subject!r}")


def encode_headers(headers: dict[str, str]) -> bytes:
    """Encode headers as the NATS/1.0 block of an HPUB."""
    lines = ["NATS/1.0"]
    for key, value in headers.items():
        if not key or any(c in key for c in ": \t\r\n") or "\r" in value or "\n" in value:
            raise ValueError(f"invalid NATS header {key!r}: {value!r}")
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def decode_headers(block: bytes) -> tuple[int | None, dict[str, str]]:
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


def parse_info(line: bytes) -> dict[str, Any]:
    """The JSON object of an INFO line; ValueError when it is not one."""
    try:
        info = msgspec.json.decode(line[5:])
    except msgspec.DecodeError as exc:
        raise ValueError(f"malformed NATS INFO: {exc}") from None
    if not isinstance(info, dict):
        raise ValueError(f"malformed NATS INFO: {line[:80]!r}")
    return info


def error_text(line: bytes) -> str:
    """The text of a -ERR line, without its quotes."""
    return line[len(b"-ERR") :].strip().strip(b"'").decode("utf-8", "replace")


def body_size(line: bytes) -> int | None:
    """The number of bytes after a MSG/HMSG line (headers and payload), None for any other op."""
    op = line[:5].upper()
    if not (op.startswith(b"MSG ") or op.startswith(b"HMSG ")):
        return None
    args = line.split()
    expected = (4, 5) if op.startswith(b"MSG ") else (5, 6)
    if len(args) not in expected or not args[-1].isdigit():
        raise NatsRequestError(f"malformed NATS message line: {line[:120]!r}")
    return int(args[-1])


class Reader:
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
            end = self._buf.find(CRLF)
            if end >= 0:
                line = bytes(self._buf[:end])
                size = body_size(line)
                if size is None:
                    del self._buf[: end + 2]
                    return line, None
                start, stop = end + 2, end + 2 + size
                if len(self._buf) >= stop + 2:
                    if self._buf[stop : stop + 2] != CRLF:
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
        chunk = self._sock.recv(RECV_SIZE)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._buf += chunk


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
