"""The bulk reader's frame cutter (``log_reader._Link._cut``): the entries it cuts from the bytes a server
sends do not depend on where the reads end, the common frame's expression and the general path agree, and
the statuses that end a request are counted."""

from __future__ import annotations

import pytest

from corral.libs.runtime.log_reader import _Link

HEADERS = b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n"


def stored(seq: int, pending: int, payload: bytes, v2: bool = False) -> bytes:
    """A stored message as a pull consumer delivers it (the v1 ack subject, or the v2 form with a domain, an
    account hash and a token)."""
    subject = f"corral.evt.job.{seq}.job_submitted".encode()
    middle = b"hub.ACCHASH." if v2 else b""
    ack = b"$JS.ACK." + middle + b"CORRAL_EVENTS.bulk-1f.1.%d.%d.1764770000000000000.%d" % (seq, seq, pending)
    if v2:
        ack += b".tok"
    body = HEADERS + payload
    return b"HMSG %s 1 %s %d %d\r\n%s\r\n" % (subject, ack, len(HEADERS), len(body), body)


def status(text: bytes) -> bytes:
    """A status that ends a pull request (no reply subject)."""
    block = b"NATS/1.0 " + text + b"\r\n\r\n"
    return b"HMSG _INBOX.bulk 1 %d %d\r\n%s\r\n" % (len(block), len(block), block)


def stream(n: int) -> bytes:
    frames = []
    for seq in range(1, n + 1):
        # Payloads that hold what a frame's line holds: only the sizes say where a frame ends.
        payload = b'{"script":"HMSG a 1 $JS.ACK.S.C.1.9.9.9.0 1 2\\r\\n"}' * (seq % 3)
        frames.append(stored(seq, n - seq, payload, v2=seq % 4 == 0))
        if seq % 5 == 0:
            frames.append(status(b"409 Batch Completed"))
    return b"".join(frames)


def cut(data: bytes, piece: int, to_seq: int) -> tuple[list[tuple[int, str, bytes]], int, bool]:
    """Feed ``data`` ``piece`` bytes at a time, cutting after each; the entries (copied as they come), the
    requests ended and whether the cut said it was done."""
    link = _Link("_INBOX.bulk")
    got: list[tuple[int, str, bytes]] = []
    ended, done = 0, False
    for at in range(0, len(data), piece):
        chunk = data[at : at + piece]
        link._make_room()
        assert len(link.buf) - link.filled >= len(chunk)
        link.buf[link.filled : link.filled + len(chunk)] = chunk
        link.filled += len(chunk)
        entries: list[tuple[int, str, memoryview]] = []
        done, more = link._cut(entries, to_seq)
        ended += more
        got += [(seq, subject, bytes(view)) for seq, subject, view in entries]
        if done:
            break
    return got, ended, done


@pytest.mark.parametrize("piece", [1, 7, 64, 1000, 1 << 20], ids=lambda p: f"{p}-byte reads")
def test_the_entries_do_not_depend_on_where_the_reads_end(piece: int) -> None:
    data = stream(20)
    got, ended, done = cut(data, piece, to_seq=1000)
    assert done, "the last entry says nothing is pending after it"
    assert [seq for seq, _, _ in got] == list(range(1, 21))
    assert ended == 3  # the statuses after entries 5, 10, 15 (the one after 20 comes after the end)
    for seq, subject, payload in got:
        assert subject == f"corral.evt.job.{seq}.job_submitted"
        assert payload.count(b"HMSG") == seq % 3


def test_the_cut_stops_at_the_last_sequence_asked_for() -> None:
    got, _, done = cut(stream(20), 1 << 20, to_seq=8)
    assert done and [seq for seq, _, _ in got] == list(range(1, 9))
