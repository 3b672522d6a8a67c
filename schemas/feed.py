"""The job event feed, version 1: what subscribers outside Corral read (``corral.feed.v1.>``).

The log is Corral's truth but not an interface: its subjects carry no user, it holds scripts and
environments, and its event types follow the scheduler's needs. The feed is a documented, versioned subset of
it, projected by the feed service (``services/feed``) from the same fold the scheduler runs, so an entry the
fold ignores (a deposed leader's decision, a stale run fact) is not in the feed either:

- ``FeedSubmitted``: a job entered the queue (each array task is a job of its own);
- ``FeedStarted``: it was allocated its nodes and is RUNNING (one per run: ``attempt`` from 0);
- ``FeedRequeued``: its run ended and it is PENDING again (``attempt`` names the run that ended);
- ``FeedEnded``: it reached a terminal state, with its exit code and signal;
- ``FeedNode``: a node went down, came up, was drained or resumed.

Each is the ``event`` of one ``FeedMessage`` on ``corral.feed.v1.job.<account>.<user>.<id>.<kind>`` or
``corral.feed.v1.node.<node>.<kind>`` (``subjects.feed_job_subject``), with the log sequence it comes from.
Evolution follows the log's rules: fields are added at the end with defaults, a tag is never reused; a
breaking change is ``v2`` on new subjects. The JSON Schema is ``schemas/jsonschema/feed-v1.json``.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from corral.schemas.lifecycle import JobState

#: The kind token of each message's subject, by event type.
FeedKind = Literal["submitted", "started", "requeued", "ended", "node"]

#: A node's change as the feed says it.
NodeChange = Literal["down", "up", "drained", "resumed"]


class FeedSubmitted(msgspec.Struct, frozen=True, tag="submitted", kw_only=True):
    """A job entered the queue."""

    job_id: int  # the job
    user: str  # its owner (the authenticated submitter)
    account: str | None  # its account (None: none)
    partition: str | None  # the partition asked for (None: the cluster's default)
    name: str  # the job's name
    nodes: int  # nodes asked for
    gpus_per_node: int  # GPUs asked for per node
    array_job_id: int = 0  # the array's id for an array task, 0 otherwise
    array_task_id: int | None = None  # the task's index, None if not an array task


class FeedStarted(msgspec.Struct, frozen=True, tag="started", kw_only=True):
    """A job was allocated nodes: it is RUNNING."""

    job_id: int  # the job
    user: str  # its owner
    attempt: int  # the run, from 0 (SLURM_RESTART_COUNT)
    partition: str  # where it runs
    nodes: list[str]  # its nodes, the batch node first
    gpus: int  # GPUs allocated over all its nodes


class FeedRequeued(msgspec.Struct, frozen=True, tag="requeued", kw_only=True):
    """A job's run ended and the job is PENDING again, to run under the same id."""

    job_id: int  # the job
    user: str  # its owner
    attempt: int  # the run that ended
    reason: str  # why: NodeFail, Requested, Preempted (``events.RequeueReason``)


class FeedEnded(msgspec.Struct, frozen=True, tag="ended", kw_only=True):
    """A job reached a terminal state; it never changes again."""

    job_id: int  # the job
    user: str  # its owner
    state: JobState  # COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED
    exit_code: int  # the batch script's exit code (0 when killed by a signal)
    signal: int  # the terminating signal, 0 if none
    reason: str = ""  # why it failed (``events.EndReason``), "" for the other states


class FeedNode(msgspec.Struct, frozen=True, tag="node", kw_only=True):
    """A node's availability or drain changed."""

    node: str  # the node
    change: NodeChange  # down | up | drained | resumed
    reason: str = ""  # why it is down or drained, "" otherwise


FeedEvent = FeedSubmitted | FeedStarted | FeedRequeued | FeedEnded | FeedNode


class FeedMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One message of the feed."""

    version: Literal[1] = 1  # the feed's version (the subjects' ``v1``)
    log_seq: int  # sequence of the log entry it comes from (several messages may share one)
    occurred_at: float  # when that entry happened: seconds since the Unix epoch, UTC
    event: FeedEvent  # what happened
