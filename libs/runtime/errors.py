"""Errors shared by the services' shells.

Hierarchy::

    CorralError                     root of every error Corral raises on purpose
    +-- InvalidInput                bad input: a clear message naming the field; never retried
    +-- Forbidden                   the caller may not do this
    +-- NotFound                    no such job/node
    +-- TransientError              infrastructure hiccup: retry later (nak with delay)
    +-- AppendConflict              an optimistic-concurrency append lost the race
    +-- Unavailable                 the cluster is not reachable (commands print and exit 1)

A consumer maps them: TransientError -> nak with delay, InvalidInput -> term + dead letter,
success -> ack.
"""

from __future__ import annotations


class CorralError(Exception):
    """Root of Corral's errors; ``retryable`` says whether the same action may succeed later."""

    retryable = False


class InvalidInput(CorralError):
    """Input that violates the contract; ``field`` names the part at fault."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class Forbidden(CorralError):
    """The caller is not allowed to do this."""


class NotFound(CorralError):
    """The named job or node does not exist."""


class TransientError(CorralError):
    """A temporary failure; retry later."""

    retryable = True


class AppendConflict(TransientError):
    """An append with an expected subject sequence found a newer event: re-read and decide again."""

    def __init__(self, subject: str, expected: int) -> None:
        super().__init__(f"{subject}: last sequence is no longer {expected}")
        self.subject = subject
        self.expected = expected


class Unavailable(CorralError):
    """The cluster cannot be reached."""
