"""What the fold did with one log entry: applied it, or ignored it, and why.

Every fold handler returns an ``Outcome``; ``fold.apply`` returns it to its caller. The accounting
projection records an allocation, a start or an end only where the outcome says applied, so the fold's
guards are the one rule both follow (``services/accounting/projection.py``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: Why the fold ignored an entry. An ignored entry changes nothing of its subject (job, node, reservation):
#: only the log's position and clock move, and a decision's leader epoch is still seen (fencing).
IgnoreReason = Literal[
    "replayed",  # its sequence is at or below the state's: it was applied before
    "not_folded",  # an event type the fold leaves to others on purpose (``fold.IGNORED``)
    "unknown_job",  # no such job
    "unknown_node",  # no such node (registered)
    "stale_epoch",  # a decision of a scheduler whose leader epoch is older than one seen
    "stale_attempt",  # names another run than the job's current one
    "wrong_state",  # the job is not in a state the event applies in (``lifecycle``)
    "cancel_requested",  # the job's cancel was requested: it is not started nor acted on any more
    "held",  # the job is held: it is not started
    "throttled",  # the array's ``%P`` limit is reached
    "bad_allocation",  # an allocation names no node, a node twice or a GPU twice
    "no_room",  # a node of the allocation is down or lacks the GPUs, CPUs or memory
    "not_batch_node",  # a run start from a node of the run that is not its batch node
    "foreign_node",  # a run fact from a node the job's current run is not allocated on
    "duplicate",  # already recorded (a second exit, signal, preemption; a taken job id)
    "bad_array",  # an array submission the fold refuses (out of bounds)
    "expired",  # a reservation whose end the log's clock has passed
    "handler_failed",  # the handler raised: the entry is skipped (the scheduler dead-letters it)
    "undecodable",  # it fails to decode, or its body belongs on another subject (dead-lettered too)
]


class Outcome(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The fold's verdict on one entry."""

    applied: bool  # True: the entry changed its subject (job, node, reservation)
    reason: IgnoreReason | None = None  # why not, when not applied
    error: str = ""  # the exception, for ``handler_failed`` ("Type: message")


#: The outcome of an applied entry.
APPLIED = Outcome(applied=True)

_IGNORED: dict[str, Outcome] = {}


def ignored(reason: IgnoreReason) -> Outcome:
    """The outcome of an entry ignored for ``reason`` (one shared instance per reason)."""
    outcome = _IGNORED.get(reason)
    if outcome is None:
        outcome = _IGNORED[reason] = Outcome(applied=False, reason=reason)
    return outcome


def failed(exc: BaseException) -> Outcome:
    """The outcome of an entry whose handler raised ``exc``."""
    return Outcome(applied=False, reason="handler_failed", error=f"{type(exc).__name__}: {exc}")
