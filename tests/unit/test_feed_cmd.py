"""``corral feed``'s printing loop: each fetched message printed as a JSON line and acknowledged, and a fetch
that times out, however nats-py says so, is only a quiet moment."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import nats.errors
import pytest

from corral.cli import feed_cmd


@dataclass
class Message:
    subject: str
    data: bytes
    acked: bool = False

    async def ack(self) -> None:
        self.acked = True


@dataclass
class Subscription:
    """Answers each fetch with the next of ``answers``: messages, or an exception to raise."""

    answers: list[Any]
    fetches: int = field(default=0)

    async def fetch(self, batch: int, timeout: float) -> list[Message]:
        self.fetches += 1
        answer = self.answers.pop(0) if self.answers else nats.errors.TimeoutError()
        if isinstance(answer, BaseException):
            await asyncio.sleep(timeout)
            raise answer
        return list(answer)


def test_a_plain_timeout_of_a_fetch_is_a_quiet_moment_and_messages_are_printed_and_acked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = Message("corral.feed.v1.job.ml.alice.1.submitted", b'{"log_seq": 1}')
    second = Message("corral.feed.v1.job.ml.alice.1.started", b'{"log_seq": 2}')
    # nats-py 2.16 raises asyncio.TimeoutError itself (not nats.errors.TimeoutError) when the fetch's time ran
    # out before it sent its waiting pull request: seen in CI on a busy machine.
    sub = Subscription([TimeoutError(), [first], nats.errors.TimeoutError(), [second]])
    monkeypatch.setattr(feed_cmd, "FETCH_S", 0.01)
    asyncio.run(feed_cmd._print(sub, 0.1, time.monotonic()))  # type: ignore[arg-type]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        {"subject": first.subject, "log_seq": 1},
        {"subject": second.subject, "log_seq": 2},
    ]
    assert first.acked and second.acked
    assert sub.fetches >= 5  # it went on fetching after the second until idle for 0.1 s
