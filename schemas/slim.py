"""Submissions decoded without their script and environment: what the scheduler folds.

A ``JobSubmitted`` entry is mostly its batch script and the exported environment (~1 KB of a ~1.3 KB entry),
which the scheduler never schedules from: its state keeps each job's spec without them, and a launch order
reads them back from the entry (``services/scheduler``). Decoding them only to drop them was half the cost of
a rebuild's decode. ``decode_slim_envelope`` decodes an entry as ``codec.decode_envelope`` does, except that
a submission's spec is a ``SlimJobSpec``: the two fields are renamed to keys no writer uses, so that the
decoder skips the log's ``script`` and ``environment`` (it still scans them: the entry must be valid JSON)
and leaves their defaults, ``""`` and ``{}``.

What the slim decoder accepts: every entry the full decoder accepts, with the same values but for those two
fields, plus the submissions whose script or environment alone are malformed (the gateway, which validates
both with ``JobSpec``, never writes one; only the admin role could). The scheduler holds to the slim
decoder's verdict on every path (``services/scheduler/replay.py``), so a rebuild and the live fold agree.

Every other consumer (accounting, audit, the feed, the tracer, the gateway) keeps the full decode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Union

from corral.schemas.events import EVENT_TYPES, Envelope, Event, JobSpec, JobSubmitted
from corral.schemas.job_spec import NO_ENVIRONMENT

#: The keys the slim spec reads ``script`` and ``environment`` from: none that a writer uses, so the log's
#: keys are unknown fields, skipped.
SKIPPED_KEYS = {"script": "script (not decoded)", "environment": "environment (not decoded)"}


class SlimJobSpec(JobSpec, frozen=True, kw_only=True, omit_defaults=True, rename=SKIPPED_KEYS):
    """A ``JobSpec`` without its script and environment: as the scheduler's state keeps it
    (``fold.slim_spec``) and its decoder reads it from the log. Encoded, it omits both (always defaults)."""

    script: str = ""  # never read from the log: the submission's entry keeps it
    environment: Mapping[str, str] = NO_ENVIRONMENT  # never read from the log, like the script


class SlimJobSubmitted(JobSubmitted, frozen=True, tag="job_submitted", kw_only=True):
    """A ``JobSubmitted`` whose spec was decoded slim."""

    spec: SlimJobSpec  # what was asked for, without the script and the environment


if TYPE_CHECKING:
    SlimEvent = Event
else:
    # The log's union (``EVENT_TYPES``, so a new event type is in both) with the submission swapped for its
    # slim form, under the same tag.
    SlimEvent = Union[tuple(SlimJobSubmitted if t is JobSubmitted else t for t in EVENT_TYPES)]  # noqa: UP007


class SlimEnvelope(Envelope, frozen=True):
    """An ``Envelope`` whose submission, if it is one, was decoded slim."""

    body: SlimEvent  # what
