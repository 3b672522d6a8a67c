"""A bulk reader of the log: a pull consumer with large batches on a connection of its own, with no Python
callback per entry.

Why: a scheduler's rebuild reads the whole log. Through nats-py every entry is a message object, an
asyncio queue hop and a parse of its JetStream metadata (25-35k entries/s here); a million entries took
30 s before a single one was decoded. This reader creates an ephemeral pull consumer (no acks, in memory,
from the first sequence wanted), asks it for ``BATCH`` entries at a time over one plain socket of its own,
and cuts the messages out of what it received itself: each gives its stream sequence and the number still
pending after it in its reply subject, its subject and payload in the frame. The socket's bytes go straight
into one receive buffer (asyncio's ``BufferedProtocol``): no copy on the way and no new buffer per read.
It hands out whole batches of ``(seq, subject, data)``, and keeps two requests open, so the server sends
while the caller folds.

Why not batched direct gets (``$JS.API.DIRECT.GET`` with ``batch``, nats-server 2.11+): measured here, the
server spends 12.5 us of CPU per entry answering them, against 5 us delivering to a pull consumer, and on
two cores the server's share bounds the read (``bench/RESULTS.md``).

It connects to the server the given nats-py connection is connected to, as the same user; replies come to
that user's own inbox prefix (every role may use the consumer API and its inbox). ``data`` is a
``memoryview`` into the receive buffer, valid until the caller asks for the next batch (the buffer's bytes
are then moved over): decode it, or copy it to keep it.

It only reads what was in the log when asked (``read(from_seq, to_seq)``); a caller goes on from the last
sequence it got with the ordinary reader (``Bus.read``), which also covers what this one cannot do:
``BulkReadError`` (a connection over TLS, a refused connection or permission, a timeout) says that nothing
more can be read this way, and everything handed out before it is valid.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js import api

from corral.libs.runtime.nats_wire import error_text, parse_info
from corral.schemas import subjects

#: Most entries one pull request asks for.
BATCH = 8192
#: Most bytes one pull request asks for (an entry is at most ``codec.MAX_MESSAGE_BYTES``).
MAX_BYTES = 16 * 1024 * 1024
#: Seconds a pull request waits on the server for entries (one that ends unfilled is simply dropped).
REQUEST_EXPIRES_S = 5.0
#: Seconds without a byte from the server before the read gives up (a request expires sooner, and ends with
#: a status of its own).
TIMEOUT_S = 10.0
#: Bytes of the receive buffer (it grows for a frame larger than that).
BUFFER = 4 << 20
#: Least free room the receive buffer reads into; reading pauses below it until the caller asks for more.
READ_MIN = 256 << 10

#: HMSG <subject> <sid> $JS.ACK.<stream>.<consumer>.<delivered>.<seq>.<consumer seq>.<time>.<pending>
#: <header bytes> <total bytes>: the subject, the sequence, the pending count and the two sizes. (Classes
#: of one excluded byte are the regular expression engine's fast loop, 0.2 us a frame less than ``\S``; the
#: digits after the stream and consumer tokens keep any other form of the ack subject out: it takes the
#: general path.)
_FRAME = re.compile(
    rb"HMSG ([^ ]+) [^ ]+ \$JS\.ACK\.[^.]+\.[^.]+\.[0-9]+\.([0-9]+)\.[0-9]+\.[0-9]+\.([0-9]+)"
    rb" ([0-9]+) ([0-9]+)\r\n"
)

#: The statuses that end a pull request with ``max_bytes`` normally (408 Request Timeout too: it expired).
_REQUEST_ENDS = (b"NATS/1.0 409 Batch Completed", b"NATS/1.0 409 Message Size Exceeds MaxBytes")

#: One entry: (stream sequence, subject, the stored message's payload, valid until the next batch is asked).
RawEntry = tuple[int, str, memoryview]


class BulkReadError(Exception):
    """The bulk read cannot go on (the reason is the message); what it handed out before is valid."""


class BulkReader:
    """Reads ranges of one stream (the log by default) through ephemeral pull consumers."""

    def __init__(
        self,
        nc: Client,
        stream: str = subjects.EVENTS_STREAM,
        batch: int = BATCH,
        filter_subject: str | None = None,
        filter_subjects: Sequence[str] = (),
    ) -> None:
        self.nc = nc  # the connection whose server and user this reader uses (and which creates consumers)
        self.stream = stream  # the stream read
        self.batch = batch  # entries per pull request
        self.filter_subject = filter_subject  # only the entries on this subject (None: all)
        self.filter_subjects = list(filter_subjects)  # or on any of these (none overlapping)

    async def read(self, from_seq: int, to_seq: int) -> AsyncIterator[list[RawEntry]]:
        """The entries from ``from_seq`` to ``to_seq`` (both included; missing sequences are skipped), in
        order, in batches; BulkReadError if it has to stop before ``to_seq``."""
        if to_seq < from_seq:
            return
        js = self.nc.jetstream(timeout=TIMEOUT_S)
        name = f"bulk-{uuid.uuid4().hex}"
        config = api.ConsumerConfig(
            name=name,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=from_seq,
            ack_policy=api.AckPolicy.NONE,
            filter_subject=self.filter_subject,
            filter_subjects=self.filter_subjects or None,
            inactive_threshold=60.0,
            mem_storage=True,
            num_replicas=1,
        )
        try:
            info = await js.add_consumer(self.stream, config)
        except Exception as exc:
            raise BulkReadError(f"cannot create a pull consumer: {exc!r}") from None
        try:
            if not info.num_pending:
                return  # nothing from ``from_seq`` on (on the filtered subjects): no request would end it
            link = await _Link.open(self.nc)
            try:
                async for batch in link.pull(f"{self.stream}.{name}", self.batch, to_seq):
                    yield batch
            finally:
                await link.close()
        finally:
            with contextlib.suppress(Exception):
                await js.delete_consumer(self.stream, name)


class _Link(asyncio.BufferedProtocol):
    """One plain NATS connection: CONNECT, one inbox subscription, requests, and the replies cut out.

    The socket's bytes are received straight into one buffer (asyncio's ``BufferedProtocol``: no copy on
    the way, no new buffer per read), consumed from ``pos`` and received up to ``filled``. The entries cut
    out are views of it: the bytes before ``pos`` are moved over (``_make_room``) only when the caller asks
    for more, so an entry stays valid until its caller asks for the next batch."""

    def __init__(self, inbox: str) -> None:
        self.inbox = inbox  # where the replies come
        self.buf = bytearray(BUFFER)  # bytes received: consumed up to ``pos``, received up to ``filled``
        self.view = memoryview(self.buf)
        self.pos = 0
        self.filled = 0
        self.transport: asyncio.Transport | None = None
        self.arrived = asyncio.Event()  # set when bytes came (or the connection ended)
        self.ended = False  # the server closed the connection, or it was lost
        self.paused = False  # reading paused: the buffer is nearly full
        self.seen = 0  # bytes received up to here were looked at by the last cut

    @classmethod
    async def open(cls, nc: Client) -> _Link:
        url = nc.connected_url
        options: dict[str, Any] = getattr(nc, "options", {})
        if url is None or url.hostname is None:
            raise BulkReadError("the connection is not connected")
        if url.scheme != "nats" or options.get("tls") is not None:
            # This plain socket would send the password in the clear where nats-py's connection does not.
            raise BulkReadError("the connection uses TLS, which the bulk reader does not")
        user = options.get("user")
        inbox = f"{subjects.inbox_prefix(user or 'anonymous')}.bulk.{uuid.uuid4().hex}"
        loop = asyncio.get_running_loop()
        try:
            _, link = await asyncio.wait_for(
                loop.create_connection(lambda: cls(inbox), url.hostname, url.port or 4222), TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            raise BulkReadError(f"cannot connect to {url.hostname}:{url.port}: {exc!r}") from None
        try:
            await link._handshake(user, options.get("password"))
        except BaseException:
            await link.close()
            raise
        return link

    # The protocol: asyncio's transport calls these.
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if len(self.buf) - self.filled < READ_MIN and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        self.arrived.set()

    def eof_received(self) -> bool:
        self.ended = True
        self.arrived.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.arrived.set()

    def _write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise BulkReadError("connection lost")
        self.transport.write(data)

    async def _handshake(self, user: str | None, password: str | None) -> None:
        line = await self._line()
        if not line.startswith(b"INFO "):
            raise BulkReadError(f"not a NATS server: {line[:80]!r}")
        try:
            info = parse_info(line)
        except ValueError as exc:
            raise BulkReadError(str(exc)) from None
        if info.get("tls_required"):
            raise BulkReadError("the server requires TLS")
        connect: dict[str, Any] = {
            "verbose": False,
            "pedantic": False,
            "headers": True,
            "no_responders": True,
            "protocol": 1,
            "name": "corral-bulk-reader",
            "lang": "python",
            "version": "corral",
        }
        if user is not None:
            connect["user"], connect["pass"] = user, password or ""
        self._write(b"CONNECT " + msgspec.json.encode(connect) + b"\r\nPING\r\n")
        self._write(f"SUB {self.inbox} 1\r\nPING\r\n".encode())
        pongs = 0
        while pongs < 2:
            line = await self._line()
            if line.startswith(b"-ERR"):
                raise BulkReadError(f"the server refused: {error_text(line)}")
            if line == b"PING":
                self._write(b"PONG\r\n")
            elif line == b"PONG":
                pongs += 1

    async def pull(self, consumer: str, batch: int, to_seq: int) -> AsyncIterator[list[RawEntry]]:
        """Entries of ``consumer`` (``<stream>.<name>``) up to ``to_seq`` or the last one pending.

        Two requests are kept open: the server sends while the caller folds, and what it buffers for this
        client (two requests' max_bytes) stays under its max_pending (64 MiB by default). A request with
        ``max_bytes`` always ends with a status of its own (batch completed, max bytes reached, expired),
        which is when the next one is sent."""
        body = msgspec.json.encode(
            {"batch": batch, "max_bytes": MAX_BYTES, "expires": int(REQUEST_EXPIRES_S * 1e9)}
        )
        ask = (
            f"PUB $JS.API.CONSUMER.MSG.NEXT.{consumer} {self.inbox} {len(body)}\r\n".encode() + body + b"\r\n"
        )
        self._write(ask + ask)
        while True:
            entries: list[RawEntry] = []
            done, ended = self._cut(entries, to_seq)
            if ended and not done:
                self._write(ask * ended)
            if entries:
                yield entries
            if done:
                return
            if not await self._fill():
                raise BulkReadError(f"no entry in {TIMEOUT_S:.0f} s")

    def _cut(self, entries: list[RawEntry], to_seq: int) -> tuple[bool, int]:
        """Cut the whole messages received into ``entries``: whether the entry at ``to_seq`` (or the last one
        pending) is in, and how many requests ended."""
        buf, pos, filled, view = self.buf, self.pos, self.filled, self.view
        self.seen = filled
        find, frame, append = buf.find, _FRAME.match, entries.append
        ended = 0
        try:
            while True:
                # The common frame, a stored message with headers and a v1 ack subject, in one match.
                m = frame(buf, pos, filled)
                if m is not None:
                    subject, seq_text, pending, head, total = m.groups()
                    start = m.end()
                    end = start + int(total)
                    if end + 2 > filled:
                        return False, ended
                    pos = end + 2
                    seq = int(seq_text)
                    if seq > to_seq:
                        return True, ended
                    append((seq, subject.decode(), view[start + int(head) : end]))
                    if seq == to_seq or pending == b"0":
                        return True, ended
                    continue
                eol = find(b"\r\n", pos, filled)
                if eol < 0:
                    return False, ended
                if not buf.startswith(b"HMSG ", pos) and not buf.startswith(b"MSG ", pos):
                    self._control(bytes(buf[pos:eol]))
                    pos = eol + 2
                    continue
                # [H]MSG <subject> <sid> [<reply>] [<header bytes>] <total bytes>
                args = bytes(buf[pos:eol]).split()
                headed = args[0] == b"HMSG"
                total = int(args[-1])
                start = eol + 2
                end = start + total
                if end + 2 > filled:
                    return False, ended
                pos = end + 2
                if len(args) != (6 if headed else 5):
                    # No reply subject: a status, the end of a request.
                    self._status(bytes(buf[start : start + (int(args[-2]) if headed else 0)]))
                    ended += 1
                    continue
                # $JS.ACK.<stream>.<consumer>.<delivered>.<seq>.<consumer seq>.<time>.<pending>, or the v2
                # form with a domain and an account hash in front and a token at the end.
                acks = args[3].split(b".")
                at = 5 if len(acks) == 9 else 7
                seq, count = int(acks[at]), int(acks[at + 3])
                body = start + (int(args[4]) if headed else 0)
                if seq > to_seq:
                    return True, ended
                append((seq, args[1].decode(), view[body:end]))
                if seq == to_seq or count == 0:
                    return True, ended
        finally:
            self.pos = pos

    @staticmethod
    def _status(block: bytes) -> None:
        """Accept the statuses that end a request normally; BulkReadError for any other."""
        line = block.split(b"\r\n", 1)[0]
        if line.startswith(b"NATS/1.0 408") or line in _REQUEST_ENDS:
            return
        raise BulkReadError(f"the consumer answered {line.decode('utf-8', 'replace')}")

    def _control(self, line: bytes) -> None:
        if line == b"PING":
            self._write(b"PONG\r\n")
        elif line.startswith(b"-ERR"):
            raise BulkReadError(f"the server refused: {error_text(line)}")

    async def _fill(self, timeout: float = TIMEOUT_S) -> bool:
        """Wait for bytes after those the last cut saw (``seen``); False if none came in ``timeout``
        seconds."""
        self._make_room()
        while self.filled == self.seen:
            if self.ended:
                raise BulkReadError("the server closed the connection")
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout)
            except TimeoutError:
                return False
        return True

    def _make_room(self) -> None:
        """Move the bytes not consumed yet to the front of the buffer (to a bigger one if they nearly fill
        it), and read on if reading was paused. The bytes before ``pos`` are no one's any more: the
        entries cut from them went out in a batch that its caller is done with."""
        pos, left = self.pos, self.filled - self.pos
        if left + READ_MIN > len(self.buf):
            # (Nearly full of bytes not consumed: a frame larger than the room left.)
            grown = bytearray(max(2 * len(self.buf), left + READ_MIN))
            grown[:left] = self.view[pos : self.filled]
            self.buf, self.view = grown, memoryview(grown)
        elif pos and left:
            self.buf[:left] = self.buf[pos : self.filled]
        self.pos, self.filled, self.seen = 0, left, self.seen - pos
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    async def _line(self) -> bytes:
        while True:
            eol = self.buf.find(b"\r\n", self.pos, self.filled)
            self.seen = self.filled
            if eol >= 0:
                line = bytes(self.buf[self.pos : eol])
                self.pos = eol + 2
                return line
            if not await self._fill():
                raise BulkReadError(f"no reply in {TIMEOUT_S:.0f} s")

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
