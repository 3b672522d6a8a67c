"""The events of advance reservations (on ``corral.evt.resv.<name>.<tag>``): an admin's create and delete
intents (gateway) and the scheduler's answers.
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: Reservation flags Corral implements (Slurm's names): MAINT = maintenance (may overlap other reservations,
#: outsiders see ``ReqNodeNotAvail, Reserved for maintenance``); IGNORE_JOBS = created even if jobs run then.
ReservationFlag = Literal["MAINT", "IGNORE_JOBS"]


class ReservationCreateRequested(
    msgspec.Struct, frozen=True, tag="reservation_create_requested", kw_only=True
):
    """Intent (gateway): an admin asked for an advance reservation (scontrol create reservation).

    Exactly one of ``nodes``, ``node_count`` and ``gpu_count`` says what to reserve; the scheduler answers
    with ``ReservationCreated`` (the concrete nodes) or ``ReservationRejected``.
    """

    name: str  # ReservationName, one subject token
    user: str  # who asked (authenticated, an admin)
    start_time: float  # StartTime, Unix seconds
    end_time: float  # EndTime, Unix seconds (StartTime + Duration)
    nodes: list[str] = []  # Nodes=: these nodes, whole (expanded hostlist)
    node_count: int = 0  # NodeCnt=: this many whole nodes of the partition
    gpu_count: int = 0  # TRES=gres/gpu=N: this many GPUs of the partition (not whole nodes)
    partition: str | None = None  # PartitionName=; None = the default partition
    users: list[str] = []  # Users=: who may use it
    accounts: list[str] = []  # Accounts=: jobs of these accounts may use it
    flags: list[ReservationFlag] = []  # Flags=


class ReservationDeleteRequested(
    msgspec.Struct, frozen=True, tag="reservation_delete_requested", kw_only=True
):
    """Intent (gateway): an admin asked to delete a reservation (scontrol delete ReservationName=)."""

    name: str  # the reservation
    user: str  # who asked (authenticated, an admin)


class ReservationCreated(msgspec.Struct, frozen=True, tag="reservation_created", kw_only=True):
    """Decision (scheduler): a reservation exists over ``[start_time, end_time)`` on these nodes.

    Outsiders may not use what it holds over that window; jobs of its users/accounts that ask for it
    (``--reservation``) run only there and then. It is over once the log's clock reaches ``end_time``.
    """

    name: str  # ReservationName
    start_time: float  # StartTime
    end_time: float  # EndTime
    nodes: list[str]  # the nodes chosen, sorted
    gpus: list[int] = []  # GPUs held on each node of ``nodes`` (same order); [] = the whole nodes
    partition: str = ""  # PartitionName
    users: list[str] = []  # Users=
    accounts: list[str] = []  # Accounts=
    flags: list[ReservationFlag] = []  # Flags=
    by: str = ""  # the admin who asked
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class ReservationRejected(msgspec.Struct, frozen=True, tag="reservation_rejected", kw_only=True):
    """Decision (scheduler): a reservation request cannot be carried out (Slurm's reason, for the admin)."""

    name: str  # the reservation
    reason: str  # e.g. "Requested nodes are busy"
    delete: bool = False  # the rejected request was a delete (else a create)
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


class ReservationDeleted(msgspec.Struct, frozen=True, tag="reservation_deleted", kw_only=True):
    """Decision (scheduler): a reservation is gone; what it held is free for everyone."""

    name: str  # the reservation
    by: str  # the admin who asked
    epoch: int = 0  # leader epoch of the scheduler that decided (fencing)


#: The events of reservations (on ``corral.evt.resv.<name>.<tag>``).
RESERVATION_EVENTS = (
    ReservationCreateRequested,
    ReservationDeleteRequested,
    ReservationCreated,
    ReservationRejected,
    ReservationDeleted,
)
ReservationEvent = (
    ReservationCreateRequested
    | ReservationDeleteRequested
    | ReservationCreated
    | ReservationRejected
    | ReservationDeleted
)
