"""The API's replies: one tagged Struct per verb's answer, and ``ApiError`` for a rejected request.

Both are tagged, so a client decodes ``Reply | ApiError``.
"""

from __future__ import annotations

import msgspec

from corral.schemas.api_views import (
    AcctJob,
    CancelOutcome,
    JobInfo,
    JobOutcome,
    JobPriority,
    LiveCount,
    NodeInfo,
    PartitionInfo,
    PriorityWeightsInfo,
    ReservationInfo,
    ShareInfo,
)
from corral.schemas.events import Envelope


class ApiError(msgspec.Struct, frozen=True, tag="error", kw_only=True):
    """A rejected request: nothing was appended to the log."""

    error: str  # one line for the user, naming the problem and the fix
    field: str | None = None  # the request field at fault, if one is
    code: str = "invalid"  # invalid | forbidden | not_found | unavailable | internal
    retryable: bool = False  # whether the same request may succeed later


class SubmitReply(msgspec.Struct, frozen=True, tag="submitted", kw_only=True):
    """The job was accepted and appended to the log."""

    job_id: int  # the new job's id


class SubmitBatchReply(msgspec.Struct, frozen=True, tag="submitted_batch", kw_only=True):
    """The outcome of each job of a submit_batch request, in the request's order: the job's id, or why it was
    refused (nothing appended for it). A retryable error's job may be sent again with the same token."""

    results: list[SubmitReply | ApiError]  # one per job of the request


class WillRunReply(msgspec.Struct, frozen=True, tag="will_run_reply", kw_only=True):
    """The estimate for a job that was validated but not submitted (``sbatch --test-only``)."""

    job_id: int  # the id it was planned under (about the id it would get)
    start: float | None  # Unix time it would start (now: at once); None: not within the backfill window
    nodes: list[str] = []  # the nodes it would get at once ([] if it would wait)
    cpus: int = 0  # the CPUs it would be allocated
    partition: str = ""  # its partition
    reason: str = ""  # its pending reason if it would wait


class CancelReply(msgspec.Struct, frozen=True, tag="cancel_reply", kw_only=True):
    """Outcome per job."""

    outcomes: list[CancelOutcome]  # one per requested job


class ControlReply(msgspec.Struct, frozen=True, tag="control_reply", kw_only=True):
    """Outcome per job of a hold, release or update request."""

    outcomes: list[JobOutcome]  # one per requested job


class JobsReply(msgspec.Struct, frozen=True, tag="jobs_reply", kw_only=True):
    """The matching jobs by id, one page of them: a reply stops before it would outgrow its bound (a queue of
    thousands of jobs is more than one NATS message may carry), and says so (``more``)."""

    jobs: list[JobInfo]  # matches, by id
    more: bool = False  # more match: ask again with ``after_job_id`` = ``last_job_id`` (or the last job's id)
    last_job_id: int = 0  # the largest id the page covers (a row may stand for tasks up to it); 0: its last's


class LiveCountsReply(msgspec.Struct, frozen=True, tag="live_counts_reply", kw_only=True):
    """The user's pending and running jobs counted by QOS and account, sorted by both."""

    counts: list[LiveCount]  # one per (QOS, account) with a live job


class PriorityReply(msgspec.Struct, frozen=True, tag="priority_reply", kw_only=True):
    """The matching pending jobs by id, one page of them (``JobsReply``'s paging), and the weights; sorted by
    ``JobPriority.queue_key`` they are in queue order."""

    jobs: list[JobPriority]  # matches
    weights: PriorityWeightsInfo  # the weights in force
    more: bool = False  # more match: ask again with ``after_job_id`` the last job's id here


class SharesReply(msgspec.Struct, frozen=True, tag="shares_reply", kw_only=True):
    """The tree in depth-first order, root first, one page of it (``more``: ask again with ``start`` past the
    rows received so far)."""

    rows: list[ShareInfo]  # associations
    more: bool = False  # more rows follow


class NodesReply(msgspec.Struct, frozen=True, tag="nodes_reply", kw_only=True):
    """Nodes by name, one page of them (``JobsReply``'s paging, by node name), and every partition (in each
    page)."""

    nodes: list[NodeInfo]  # nodes, sorted by name
    partitions: list[PartitionInfo]  # partitions, in config order
    more: bool = False  # more match: ask again with ``after_node`` the last node's name here


class AcctReply(msgspec.Struct, frozen=True, tag="acct_reply", kw_only=True):
    """Matching accounting records, by job id, one page of them (``JobsReply``'s paging: ``more`` when the
    page stopped at its bound before the request's ``limit``)."""

    jobs: list[AcctJob]  # matches, by id
    more: bool = False  # more may match: ask again after the last job's id, for the rest of ``limit``


class ReservationReply(msgspec.Struct, frozen=True, tag="reservation_reply", kw_only=True):
    """The scheduler created or deleted the reservation."""

    name: str  # the reservation


class ReservationsReply(msgspec.Struct, frozen=True, tag="reservations_reply", kw_only=True):
    """Reservations, by name."""

    reservations: list[ReservationInfo]  # matches


class ControllerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One scheduler as ``scontrol ping`` shows it."""

    name: str  # its name (``--name``: its host by default)
    role: str  # primary (the lease holder), backup or backupN
    up: bool  # it holds its lease (primary) or beat recently (backup)


class PingReply(msgspec.Struct, frozen=True, tag="ping_reply", kw_only=True):
    """The schedulers, the leader first."""

    controllers: list[ControllerInfo]  # primary first, then the backups by name


class NodeUpdateReply(msgspec.Struct, frozen=True, tag="node_update_reply", kw_only=True):
    """Every node of the request is drained (or resumed)."""

    nodes: list[str]  # the nodes, as requested


class HistoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of the log, as ``corral audit`` shows it."""

    seq: int  # its stream sequence (the log's total order)
    envelope: Envelope  # the entry: meta (who, when, why) and body (what)


class HistoryReply(msgspec.Struct, frozen=True, tag="history_reply", kw_only=True):
    """The entries asked for, in log order."""

    entries: list[HistoryEntry]  # oldest first
    truncated: bool = False  # older entries matched too but were left out (the request's limit, or size)
    # Entries outside the history that its entries name as causes (a node's NodeDown, a preemptor's
    # submission), up to two steps back, scripts and environments left out: to say why, in log order
    causes: list[HistoryEntry] = []
    job_id: int | None = None  # the job a job's history is of (an ``A_T`` request's task, by its own id)
