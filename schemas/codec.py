"""Encoding and decoding of envelopes, orders and API messages (JSON, via msgspec)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from corral.schemas.events import Envelope, Event, Meta
from corral.schemas.slim import SlimEnvelope

T = TypeVar("T")

#: Largest message any decoder accepts; larger input is rejected before parsing.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The largest reply a query verb sends (``page``): under the decoders' limit, and NATS's max_payload (8 MiB
#: in Corral's servers' configuration).
MAX_REPLY_BYTES = 3 * 1024 * 1024

_encoder = msgspec.json.Encoder()
_envelope_decoder = msgspec.json.Decoder(Envelope)
_slim_decoder = msgspec.json.Decoder(SlimEnvelope)
#: The slim decoder itself, for a loop that checks the size and catches ``msgspec.DecodeError`` on its own
#: (``services/scheduler/replay.py``: a call less per entry); ``decode_slim_envelope`` otherwise.
slim_decode = _slim_decoder.decode


class DecodeError(ValueError):
    """A message that is not valid for its schema; ``str()`` names the field at fault."""


def encode(obj: Any) -> bytes:
    """JSON-encode any Struct (envelope, order, API message)."""
    return _encoder.encode(obj)


def page(items: Iterable[T], bound: int) -> tuple[list[T], bool]:
    """The first of ``items`` whose JSON together fits in ``bound`` bytes (one at least, whatever its size, so
    that paging always ends), and whether any was left out: a reply's page, under the largest message NATS
    and the decoders take. Items past the first left out are not asked for (a lazy iterable stops there)."""
    out: list[T] = []
    size = 0
    for item in items:
        size += len(_encoder.encode(item)) + 1
        if size > bound and out:
            return out, True
        out.append(item)
    return out, False


def decode_envelope(data: bytes) -> Envelope:
    """Decode one log entry; DecodeError names the bad field."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        return _envelope_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from None


def decode_slim_envelope(data: bytes | memoryview) -> Envelope:
    """Decode one log entry as the scheduler folds it: a submission without its script and environment
    (``slim.py``, which says what else it accepts); DecodeError names the bad field."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        return _slim_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from None


def decode(data: bytes, cls: Any) -> Any:
    """Decode a message of a known type (or a union of tagged types); DecodeError names the bad field."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise DecodeError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        return msgspec.json.decode(data, type=cls)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from None


def new_event_id() -> str:
    """A fresh unique event id."""
    return uuid.uuid4().hex


def envelope(
    body: Event,
    *,
    actor: str,
    occurred_at: float | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
    traceparent: str | None = None,
    event_id: str | None = None,
) -> Envelope:
    """Wrap an event; the clock is read here (the shell), never in the core."""
    meta = Meta(
        event_id=event_id or new_event_id(),
        occurred_at=time.time() if occurred_at is None else occurred_at,
        actor=actor,
        correlation_id=correlation_id,
        causation_id=causation_id,
        traceparent=traceparent,
    )
    return Envelope(meta=meta, body=body)
